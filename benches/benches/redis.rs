//! lock-redis against the raw minimal Redis lock commands and the `rslock` crate, on a
//! private redis-server started for the run.
//!
//! Run with `cargo bench -p distlock-benches --bench redis`.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use conformance_tests::store_process::{StoreProcess, StoreSpec};
use distlock_benches::{
    acquired, distinct_keys, one_key, one_key_library, report, sample, wait_for_next_holder, Sample,
};
use lock_core::backend::LeaseRenewal;
use lock_core::{AcquireOptions, LockClient, Renewal};

const RUNS: usize = 2000;
const TTL: Duration = Duration::from_secs(30);

/// The usual hand-written lock: SET NX PX, and a compare-and-delete script to release.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = StoreProcess::start(StoreSpec::redis())
        .await
        .expect("redis-server must be installed for this bench");
    let url = format!("redis://{}/0", server.addr());
    println!("redis-server on {}", server.addr());

    let raw = raw_cycle(&url).await;
    report("raw SET NX PX + compare-and-delete", &raw);
    let library = library_cycle(&url, Renewal::Auto).await;
    report("lock-redis try_lock + release (auto renewal)", &library);
    let manual = library_cycle(&url, Renewal::Manual).await;
    report("lock-redis try_lock + release (manual)", &manual);
    let peer = rslock_cycle(&url).await;
    report("rslock lock + unlock", &peer);
    println!(
        "ratio to raw: lock-redis auto {:.2}x, manual {:.2}x, rslock {:.2}x",
        ratio(&library, &raw),
        ratio(&manual, &raw),
        ratio(&peer, &raw)
    );

    // Closed before the runs that follow, so its session does not linger into them.
    let client = library_client(&url, Renewal::Auto).await;
    distinct_keys("lock-redis 16 tasks, distinct keys", &client, 16, 500).await;
    drop(client);
    one_key_library("lock-redis 8 tasks, one key", || {
        let url = url.clone();
        async move { library_client(&url, Renewal::Auto).await }
    })
    .await;
    one_key_rslock(&url).await;
    renew_many(&url).await;
}

fn ratio(a: &Sample, b: &Sample) -> f64 {
    a.median.as_secs_f64() / b.median.as_secs_f64()
}

fn client_options(renewal: Renewal) -> AcquireOptions {
    AcquireOptions {
        ttl: TTL,
        renewal,
        ..AcquireOptions::default()
    }
}

async fn library_client(url: &str, renewal: Renewal) -> LockClient {
    LockClient::new(lock_redis::connect(url).await.unwrap()).with_defaults(client_options(renewal))
}

async fn raw_cycle(url: &str) -> Sample {
    let client = redis::Client::open(url).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    let release = redis::Script::new(COMPARE_AND_DELETE);
    sample(RUNS, || {
        let (mut connection, release) = (connection.clone(), &release);
        async move {
            let value = format!("{:032x}", random_id());
            let set: Option<String> = redis::cmd("SET")
                .arg("raw:bench")
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut connection)
                .await
                .unwrap();
            assert!(set.is_some());
            let deleted: i64 = release
                .key("raw:bench")
                .arg(&value)
                .invoke_async(&mut connection)
                .await
                .unwrap();
            assert_eq!(deleted, 1);
        }
    })
    .await
}

fn random_id() -> u128 {
    lock_core::LeaseId::random().as_u128()
}

async fn library_cycle(url: &str, renewal: Renewal) -> Sample {
    let client = library_client(url, renewal).await;
    sample(RUNS, || {
        let client = &client;
        async move {
            let guard = client.try_lock("bench/uncontended").await.unwrap();
            guard.release().await.unwrap();
        }
    })
    .await
}

async fn rslock_cycle(url: &str) -> Sample {
    let manager = rslock::LockManager::new(vec![url.to_string()]);
    sample(RUNS, || {
        let manager = &manager;
        async move {
            let lock = manager.lock(b"rslock:bench".as_slice(), TTL).await.unwrap();
            manager.unlock(&lock).await;
        }
    })
    .await
}

async fn one_key_rslock(url: &str) {
    one_key("rslock 8 tasks, one key", |task, stats, count, deadline| {
        let manager = rslock::LockManager::new(vec![url.to_string()]);
        async move {
            while Instant::now() < deadline {
                let lock = manager
                    .acquire_no_guard(b"rslock:one-key".as_slice(), TTL)
                    .await
                    .unwrap();
                let mine = acquired(&stats, &count, task);
                manager.unlock(&lock).await;
                wait_for_next_holder(&count, mine, deadline).await;
            }
        }
    })
    .await;
}

/// One client holding 1,000 locks renews them all at once, as its renewal engine does: one
/// `renew_many` call (chunked and pipelined by the backend).
async fn renew_many(url: &str) {
    let backend = lock_redis::connect(url).await.unwrap();
    let client = LockClient::new(backend.clone()).with_defaults(client_options(Renewal::Manual));
    let mut guards = Vec::with_capacity(1000);
    for index in 0..1000 {
        guards.push(
            client
                .try_lock(format!("bench/held/{index}"))
                .await
                .unwrap(),
        );
    }
    let items: Vec<LeaseRenewal> = guards
        .iter()
        .map(|guard| LeaseRenewal {
            key: guard.key().clone(),
            lease_id: guard.lease().id(),
            ttl: TTL,
        })
        .collect();
    let round = sample(20, || {
        let (backend, items) = (&backend, &items);
        async move {
            let renewed = backend.renew_many(items).await;
            assert!(renewed.into_iter().all(|r| r.unwrap().is_held()));
        }
    })
    .await;
    report("lock-redis renew 1,000 held locks (one round)", &round);
    println!("{:<45} {:>10.2?} per lock", "", round.median / 1000);
    for guard in guards {
        guard.release().await.unwrap();
    }
}
