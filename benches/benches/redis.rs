//! lock-redis against the raw minimal Redis lock commands and the `rslock` crate, on a
//! private redis-server started for the run.
//!
//! Run with `cargo bench -p distlock-benches --bench redis`.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::store_process::{StoreProcess, StoreSpec};
use distlock_benches::{report, sample, Sample};
use lock_core::backend::LeaseRenewal;
use lock_core::{AcquireOptions, LockClient, Renewal};
use tokio::sync::watch;
use tokio::task::JoinSet;

const RUNS: usize = 2000;
const TTL: Duration = Duration::from_secs(30);
const CONTENDED_FOR: Duration = Duration::from_secs(3);

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

    distinct_keys(&url).await;
    one_key_library(&url).await;
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
    LockClient::from_dyn(lock_redis::connect(url).await.unwrap())
        .with_defaults(client_options(renewal))
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

/// 16 tasks, each locking and releasing its own key in a loop.
async fn distinct_keys(url: &str) {
    let client = library_client(url, Renewal::Auto).await;
    let per_task = 500;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for task in 0..16 {
        let client = client.clone();
        tasks.spawn(async move {
            let key = format!("bench/distinct/{task}");
            for _ in 0..per_task {
                let guard = client.try_lock(&key).await.unwrap();
                guard.release().await.unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let elapsed = started.elapsed();
    println!(
        "{:<45} {:>10.0} cycles/s  ({} cycles in {elapsed:.2?})",
        "lock-redis 16 tasks, distinct keys",
        (16 * per_task) as f64 / elapsed.as_secs_f64(),
        16 * per_task
    );
}

/// Acquisitions and release-to-next-holder latencies of tasks contending for one key.
#[derive(Default)]
struct Handovers {
    last_release: Option<(usize, Instant)>,
    latencies: Vec<Duration>,
    acquisitions: usize,
}

impl Handovers {
    fn acquired(&mut self, task: usize) {
        self.acquisitions += 1;
        if let Some((by, at)) = self.last_release.take() {
            if by != task {
                self.latencies.push(at.elapsed());
            }
        }
    }

    fn print(mut self, name: &str, elapsed: Duration) {
        self.latencies.sort();
        let at = |q: usize| {
            self.latencies
                .get(self.latencies.len() * q / 100)
                .copied()
                .unwrap_or_default()
        };
        let (median, p90) = (at(50), at(90));
        let seconds = elapsed.as_secs_f64();
        println!(
            "{name:<45} {:>8.0} handovers/s (holder changed), {:>8.0} acquisitions/s, \
             release-to-next-holder median {median:.2?} p90 {p90:.2?}",
            self.latencies.len() as f64 / seconds,
            self.acquisitions as f64 / seconds,
        );
    }
}

/// Records an acquisition by `task` and marks the release that follows at once; returns
/// the acquisition's number.
fn acquired(stats: &Mutex<Handovers>, count: &watch::Sender<usize>, task: usize) -> usize {
    let mut stats = stats.lock().unwrap();
    stats.acquired(task);
    stats.last_release = Some((task, Instant::now()));
    count.send_replace(stats.acquisitions);
    stats.acquisitions
}

/// A task that just released waits for another holder before it contends again, so every
/// acquisition is a handover to a waiter (as between processes that each lock now and then),
/// not the releaser winning its own key back.
async fn wait_for_next_holder(count: &watch::Sender<usize>, mine: usize, deadline: Instant) {
    let mut changes = count.subscribe();
    let _ = tokio::time::timeout_at(deadline.into(), changes.wait_for(|n| *n > mine)).await;
}

/// Eight tasks contend for one key for `CONTENDED_FOR`, each handing the key over before
/// it competes again; `task` builds one contender's loop from its index, the shared
/// statistics and the deadline.
async fn one_key<F, Fut>(name: &str, task: F)
where
    F: Fn(usize, Arc<Mutex<Handovers>>, Arc<watch::Sender<usize>>, Instant) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stats = Arc::new(Mutex::new(Handovers::default()));
    let count = Arc::new(watch::channel(0usize).0);
    let deadline = Instant::now() + CONTENDED_FOR;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for index in 0..8 {
        tasks.spawn(task(index, stats.clone(), count.clone(), deadline));
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let stats = Arc::try_unwrap(stats).ok().unwrap().into_inner().unwrap();
    stats.print(name, started.elapsed());
}

async fn one_key_library(url: &str) {
    one_key(
        "lock-redis 8 tasks, one key",
        |task, stats, count, deadline| {
            let url = url.to_string();
            async move {
                // A client per task, as separate processes would have.
                let client = library_client(&url, Renewal::Auto).await;
                while Instant::now() < deadline {
                    let guard = client.lock("bench/one-key").await.unwrap();
                    let mine = acquired(&stats, &count, task);
                    guard.release().await.unwrap();
                    wait_for_next_holder(&count, mine, deadline).await;
                }
            }
        },
    )
    .await;
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
    let client = library_client(url, Renewal::Manual).await;
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
    let backend = client.backend().clone();
    let round = sample(20, || {
        let (backend, items) = (&backend, &items);
        async move {
            let renewed = backend.renew_many(items).await;
            assert!(renewed.into_iter().all(|r| r.unwrap()));
        }
    })
    .await;
    report("lock-redis renew 1,000 held locks (one round)", &round);
    println!("{:<45} {:>10.2?} per lock", "", round.median / 1000);
    for guard in guards {
        guard.release().await.unwrap();
    }
}
