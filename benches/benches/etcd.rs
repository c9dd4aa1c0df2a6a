//! lock-etcd against the raw transactions it issues and etcd-client's built-in
//! `lock`/`unlock` (the server-side Lock RPC), on a private etcd started for the run.
//!
//! Run with `cargo bench -p distlock-benches --bench etcd`.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use conformance_tests::store_process::{StoreProcess, StoreSpec};
use distlock_benches::{
    acquired, distinct_keys, one_key, one_key_library, report, sample, wait_for_next_holder, Sample,
};
use etcd_client::{Compare, CompareOp, GetOptions, LockOptions, PutOptions, Txn, TxnOp};
use lock_core::{AcquireOptions, LockClient, Renewal};

const RUNS: usize = 2000;
const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = StoreProcess::start(StoreSpec::etcd().unwrap())
        .await
        .expect("etcd must be installed for this bench");
    let addr = server.addr().to_string();
    let url = format!("etcd://{addr}/bench?min_ttl_ms=1000");
    println!("etcd on {addr}");

    let raw = raw_cycle(&addr).await;
    report("raw acquire txn + release txn", &raw);
    let library = library_cycle(&url, Renewal::Auto).await;
    report("lock-etcd try_lock + release (auto renewal)", &library);
    let manual = library_cycle(&url, Renewal::Manual).await;
    report("lock-etcd try_lock + release (manual)", &manual);
    let builtin = builtin_cycle(&addr).await;
    report("etcd-client lock + unlock (Lock RPC)", &builtin);
    println!(
        "ratio to raw: lock-etcd auto {:.2}x, manual {:.2}x, etcd-client lock {:.2}x",
        ratio(&library, &raw),
        ratio(&manual, &raw),
        ratio(&builtin, &raw)
    );

    // Closed before the runs that follow, so its session does not linger into them.
    let client = library_client(&url, Renewal::Auto).await;
    distinct_keys("lock-etcd 16 tasks, distinct keys", &client, 16, 200).await;
    drop(client);
    let ours = one_key_library("lock-etcd 8 tasks, one key", || {
        let url = url.clone();
        async move { library_client(&url, Renewal::Auto).await }
    })
    .await;
    let theirs = one_key_builtin(&addr).await;
    println!(
        "one key: lock-etcd hands over {:.1}x as often as etcd-client's lock",
        ours / theirs
    );
    keep_alives_for_held_locks(&server, &url).await;
}

fn ratio(a: &Sample, b: &Sample) -> f64 {
    a.median.as_secs_f64() / b.median.as_secs_f64()
}

async fn library_client(url: &str, renewal: Renewal) -> LockClient {
    LockClient::new(lock_etcd::connect(url).await.unwrap()).with_defaults(AcquireOptions {
        ttl: TTL,
        renewal,
        ..AcquireOptions::default()
    })
}

async fn raw_client(addr: &str) -> etcd_client::Client {
    etcd_client::Client::connect([addr], None).await.unwrap()
}

/// The two transactions an uncontended `try_lock` + `release` costs the library, under
/// a lease granted once (as the library's session is).
async fn raw_cycle(addr: &str) -> Sample {
    let client = raw_client(addr).await;
    let lease = client
        .lease_client()
        .grant(TTL.as_secs() as i64, None)
        .await
        .unwrap()
        .id();
    let dir = b"raw/bench/".to_vec();
    let dir_end = b"raw/bench0".to_vec();
    sample(RUNS, || {
        let (mut kv, dir, dir_end) = (client.kv_client(), dir.clone(), dir_end.clone());
        async move {
            let id = format!("{:032x}", lock_core::LeaseId::random().as_u128());
            let entry = [dir.as_slice(), id.as_bytes()].concat();
            let acquire = Txn::new()
                .when([Compare::create_revision(dir.clone(), CompareOp::Equal, 0)
                    .with_range(dir_end.clone())])
                .and_then([TxnOp::put(
                    entry.clone(),
                    id,
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([
                    TxnOp::get(entry.clone(), None),
                    TxnOp::get(
                        dir,
                        Some(GetOptions::new().with_range(dir_end).with_limit(1)),
                    ),
                ]);
            assert!(kv.txn(acquire).await.unwrap().succeeded());
            let release = Txn::new()
                .when([Compare::create_revision(
                    entry.clone(),
                    CompareOp::Greater,
                    0,
                )])
                .and_then([TxnOp::delete(entry, None)]);
            assert!(kv.txn(release).await.unwrap().succeeded());
        }
    })
    .await
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

/// etcd-client's `lock` (the server-side Lock RPC) under a lease granted once, and
/// `unlock`.
async fn builtin_cycle(addr: &str) -> Sample {
    let client = raw_client(addr).await;
    let lease = client
        .lease_client()
        .grant(TTL.as_secs() as i64, None)
        .await
        .unwrap()
        .id();
    sample(RUNS, || {
        let mut client = client.clone();
        async move {
            let options = LockOptions::new().with_lease(lease);
            let locked = client.lock("builtin/bench", Some(options)).await.unwrap();
            client.unlock(locked.key()).await.unwrap();
        }
    })
    .await
}

async fn one_key_builtin(addr: &str) -> f64 {
    one_key(
        "etcd-client lock 8 tasks, one key",
        |task, stats, count, deadline| {
            let addr = addr.to_string();
            async move {
                let mut client = raw_client(&addr).await;
                let lease = client
                    .lease_grant(TTL.as_secs() as i64, None)
                    .await
                    .unwrap()
                    .id();
                while Instant::now() < deadline {
                    let options = LockOptions::new().with_lease(lease);
                    let locked = client.lock("builtin/one-key", Some(options)).await.unwrap();
                    let mine = acquired(&stats, &count, task);
                    client.unlock(locked.key()).await.unwrap();
                    wait_for_next_holder(&count, mine, deadline).await;
                }
            }
        },
    )
    .await
}

/// etcd's count of lease keep-alives it has served, from its metrics.
async fn renewals_served(server: &StoreProcess) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let request = "GET /metrics HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
        .lines()
        .find_map(|line| line.strip_prefix("etcd_debugging_lease_renewed_total "))
        .map_or(0.0, |count| count.trim().parse().unwrap())
}

/// One client holds 1,000 locks (automatically renewed, one TTL): the keep-alives etcd
/// serves per renewal interval (a quarter of the TTL).
async fn keep_alives_for_held_locks(server: &StoreProcess, url: &str) {
    let ttl = Duration::from_secs(3);
    let client = library_client(url, Renewal::Auto).await;
    let mut guards = Vec::with_capacity(1000);
    for index in 0..1000 {
        guards.push(
            client
                .lock(format!("bench/held/{index}"))
                .ttl(ttl)
                .await
                .unwrap(),
        );
    }
    let before = renewals_served(server).await;
    let held_for = ttl * 3;
    tokio::time::sleep(held_for).await;
    let served = renewals_served(server).await - before;
    // lock-etcd sends a session's keep-alive every quarter of its TTL.
    let intervals = held_for.as_secs_f64() / (ttl / 4).as_secs_f64();
    println!(
        "{:<45} {:>10.1} keep-alives per interval ({served} in {held_for:?})",
        "lock-etcd holding 1,000 locks",
        served / intervals
    );
    assert!(guards.iter().all(|guard| guard.is_held()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}
