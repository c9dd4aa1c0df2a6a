//! The in-memory backend: the library's uncontended acquire+release cycle against the
//! backend's raw operations, 16 tasks on distinct keys, and 8 tasks on one key.
//!
//! Run with `cargo bench -p distlock-benches --bench memory`.

use std::time::Duration;

use distlock_benches::{report, sample, Sample};
use lock_core::{AcquireRequest, LockBackend, LockClient, LockKey, MemoryBackend};

const CYCLES: usize = 20_000;
const TTL: Duration = Duration::from_secs(30);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let backend = MemoryBackend::new();
        let key = LockKey::new("bench/raw").expect("valid key");
        let raw = sample(CYCLES, || async {
            let request = AcquireRequest::new(key.clone(), TTL, Duration::ZERO);
            backend.try_acquire(&request).await.expect("free key");
            backend
                .release(&key, request.lease_id())
                .await
                .expect("held key");
        })
        .await;

        let client = LockClient::new(MemoryBackend::new());
        let library = sample(CYCLES, || async {
            let guard = client
                .try_lock("bench/library")
                .ttl(TTL)
                .await
                .expect("free key");
            guard.release().await.expect("held key");
        })
        .await;

        let distinct = contended(&client, 16, false).await;
        let shared = contended(&client, 8, true).await;

        report("raw try_acquire + release (uncontended)", &raw);
        report("library lock + release (uncontended)", &library);
        println!(
            "library / raw median ratio: {:.2}",
            library.median.as_secs_f64() / raw.median.as_secs_f64()
        );
        report("16 tasks, distinct keys, mean per cycle", &distinct);
        report("8 tasks, one key, mean per handover", &shared);
    });
}

/// `tasks` tasks each doing lock+release cycles, on distinct keys or one shared key.
async fn contended(client: &LockClient, tasks: usize, one_key: bool) -> Sample {
    let per_task = 500;
    let started = std::time::Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let client = client.clone();
        let key = if one_key {
            "bench/shared".to_string()
        } else {
            format!("bench/distinct/{task}")
        };
        set.spawn(async move {
            for _ in 0..per_task {
                let guard = client.lock(&key).ttl(TTL).await.expect("lock");
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("bench task");
    }
    let per_cycle = started.elapsed() / (tasks * per_task) as u32;
    Sample {
        median: per_cycle,
        p99: per_cycle,
        count: tasks * per_task,
    }
}
