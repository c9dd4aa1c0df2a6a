//! The lock patterns' costs in store requests, on the in-memory store and an SQLite file:
//!
//! * an idempotent call whose result is already recorded (a replay): store requests per
//!   call and latency, against the raw record read it issues;
//! * 100 tasks of one process taking turns on one key: store requests per handover when
//!   they share one client (coalesced: one remote waiter) and when each has its own
//!   client (100 remote waiters), in the same run.
//!
//! Run with `cargo bench -p distlock-benches --bench patterns`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::{FaultyBackend, Op};
use distlock_benches::{report, sample};
use lock_core::backend::{DynBackend, LockBackend};
use lock_core::{Execution, LockClient, LockKey, MemoryBackend};

const REPLAYS: usize = 5_000;
const TASKS: usize = 100;
const ROUNDS: usize = 3;

fn main() {
    distlock_benches::runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let sqlite_url = format!("sqlite://{}", dir.path().join("bench.db").display());
        let sqlite = || async {
            lock_sql::connect(&sqlite_url)
                .await
                .expect("sqlite backend")
        };
        let memory = MemoryBackend::new();
        let stores: [(&str, DynBackend); 2] = [
            ("memory", Arc::new(memory.clone())),
            ("sqlite", sqlite().await),
        ];
        for (name, backend) in stores {
            replay(name, backend).await;
        }
        // Separate clients of one store: each memory client is another handle on the same
        // map; each SQLite client its own connection pool on the same file.
        coalescing("memory", || {
            let memory = memory.clone();
            async move { Arc::new(memory) as DynBackend }
        })
        .await;
        coalescing("sqlite", sqlite).await;
    });
}

/// Replays of a recorded result: requests per call and latency, against the raw read.
async fn replay(store: &str, backend: DynBackend) {
    let faulty = FaultyBackend::new(backend.clone());
    let client = LockClient::new(faulty.clone());
    let key = "bench/idempotent";
    let first = client
        .idempotent(key)
        .run(|_| async { Ok::<_, String>(b"result".to_vec()) })
        .await
        .expect("first run");
    assert_eq!(first, Execution::Ran(b"result".to_vec()));
    let (before, reads_before) = (faulty.total_calls(), faulty.calls(Op::Record));
    let calls = std::sync::atomic::AtomicU64::new(0);
    let replays = sample(REPLAYS, || async {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let replayed = client
            .idempotent(key)
            .run(|_| async { Ok::<_, String>(Vec::new()) })
            .await
            .expect("replay");
        assert_eq!(replayed, Execution::Replayed(b"result".to_vec()));
    })
    .await;
    // Warm-up runs included: every call counts.
    let calls = calls.into_inner() as f64;
    let per_call = (faulty.total_calls() - before) as f64 / calls;
    let lock_key = LockKey::new(key).expect("valid key");
    let raw = sample(REPLAYS, || async {
        backend
            .read_record(&lock_key)
            .await
            .expect("read")
            .expect("recorded");
    })
    .await;
    report(&format!("{store}: raw read_record"), &raw);
    report(&format!("{store}: idempotent replay"), &replays);
    println!(
        "{store}: replay store requests per call {per_call:.2} ({} of them record reads), replay/raw median {:.2}",
        (faulty.calls(Op::Record) - reads_before) as f64 / calls,
        replays.median.as_secs_f64() / raw.median.as_secs_f64()
    );
}

/// 100 tasks taking turns on one key, coalesced in one client and spread over 100 clients.
async fn coalescing<F, Fut>(store: &str, connect: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = DynBackend>,
{
    let key = format!("bench/coalesced-{store}");
    let shared = FaultyBackend::new(connect().await);
    let one_client = LockClient::new(shared.clone());
    let mut own: Vec<(Arc<FaultyBackend>, LockClient)> = Vec::new();
    for _ in 0..TASKS {
        let faulty = FaultyBackend::new(connect().await);
        own.push((faulty.clone(), LockClient::new(faulty)));
    }
    for round in 0..ROUNDS {
        let clients = vec![one_client.clone(); TASKS];
        let (coalesced, took) = handovers(&key, clients, || shared.total_calls()).await;
        let each: Vec<LockClient> = own.iter().map(|(_, client)| client.clone()).collect();
        let calls = || {
            own.iter()
                .map(|(faulty, _)| faulty.total_calls())
                .sum::<u64>()
        };
        let (spread, spread_took) = handovers(&key, each, calls).await;
        println!(
            "{store} round {round}: {TASKS} tasks, one key: store requests per handover {coalesced:.1} in one client ({:.0} handovers/s), {spread:.1} in {TASKS} clients ({:.0} handovers/s): {:.1}x fewer",
            TASKS as f64 / took.as_secs_f64(),
            TASKS as f64 / spread_took.as_secs_f64(),
            spread / coalesced
        );
    }
}

/// Every client takes the key once while the others wait; store requests per handover and
/// the time all the turns took.
async fn handovers(
    key: &str,
    clients: Vec<LockClient>,
    calls: impl Fn() -> u64,
) -> (f64, Duration) {
    let before = calls();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let key = key.to_string();
        tasks.spawn(async move {
            let guard = client
                .lock(&key)
                .wait_up_to(Duration::from_secs(120))
                .await
                .expect("turn");
            // Long enough for every other task to be waiting by the release.
            tokio::time::sleep(Duration::from_millis(2)).await;
            guard.release().await.expect("held");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    let took = started.elapsed();
    ((calls() - before) as f64 / TASKS as f64, took)
}
