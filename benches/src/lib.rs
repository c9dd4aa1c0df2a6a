//! Timing helpers shared by the bench binaries: medians over many samples, printed the
//! same way for every backend.

use std::future::Future;

use lock_core::LockClient;
use std::time::{Duration, Instant};

/// The runtime every bench runs on: two worker threads, like the machine's two cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A summary of timed runs.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// The median duration of one run.
    pub median: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// How many runs were timed.
    pub count: usize,
}

/// Times `runs` sequential runs of `body` (after a tenth as many untimed warm-up runs).
pub async fn sample<F, Fut>(runs: usize, mut body: F) -> Sample
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..runs / 10 {
        body().await;
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        body().await;
        times.push(started.elapsed());
    }
    times.sort();
    Sample {
        median: times[times.len() / 2],
        p99: times[times.len() * 99 / 100],
        count: runs,
    }
}

/// Prints one line of results.
pub fn report(name: &str, sample: &Sample) {
    println!(
        "{name:<45} median {:>10.2?}  p99 {:>10.2?}  ({} runs)",
        sample.median, sample.p99, sample.count
    );
}

/// `tasks` tasks each doing `per_task` lock+release cycles, on distinct keys or one key;
/// the result is the mean wall time per cycle (per handover for one key).
pub async fn contended(
    client: &LockClient,
    tasks: usize,
    one_key: bool,
    per_task: usize,
) -> Sample {
    let started = Instant::now();
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
                let guard = client
                    .lock(&key)
                    .ttl(Duration::from_secs(30))
                    .await
                    .expect("lock");
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
