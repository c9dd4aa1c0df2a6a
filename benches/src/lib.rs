//! Timing helpers shared by the bench binaries: medians over many samples, printed the
//! same way for every backend.

use std::future::Future;
use std::time::{Duration, Instant};

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
