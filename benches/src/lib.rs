//! Timing helpers and the contention harness shared by the bench binaries: medians over
//! many samples and handovers on one contended key, measured and printed the same way for
//! every backend.

use std::future::Future;
use std::sync::{Arc, Mutex};

use lock_core::LockClient;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;

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

/// How long the one-key benches let their tasks contend: long enough for thousands of
/// handovers on a fast store, short enough to keep a whole bench run to minutes.
pub const CONTENDED_FOR: Duration = Duration::from_secs(3);

/// `tasks` tasks of one library client, each locking and releasing its own key in a loop
/// of `per_task` cycles: the throughput when locks do not contend, printed as cycles per
/// second under `name`. Shared so every backend's bench measures and prints it alike.
pub async fn distinct_keys(name: &str, client: &LockClient, tasks: usize, per_task: usize) {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for task in 0..tasks {
        let client = client.clone();
        set.spawn(async move {
            let key = format!("bench/distinct/{task}");
            for _ in 0..per_task {
                let guard = client.try_lock(&key).await.expect("try_lock");
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("bench task");
    }
    let elapsed = started.elapsed();
    println!(
        "{:<45} {:>10.0} cycles/s  ({} cycles in {elapsed:.2?})",
        name,
        (tasks * per_task) as f64 / elapsed.as_secs_f64(),
        tasks * per_task
    );
}

/// Acquisitions and release-to-next-holder latencies of tasks contending for one key:
/// what [`one_key`] measures, for every backend and peer crate the same way.
#[derive(Default)]
pub struct Handovers {
    last_release: Option<(usize, Instant)>,
    latencies: Vec<Duration>,
    acquisitions: usize,
}

impl Handovers {
    /// Counts an acquisition by `task`; when another task released last, records the time
    /// from that release to now as a handover.
    pub fn acquired(&mut self, task: usize) {
        self.acquisitions += 1;
        if let Some((by, at)) = self.last_release.take() {
            if by != task {
                self.latencies.push(at.elapsed());
            }
        }
    }

    /// Prints one line of results under `name` for a run of `elapsed`; returns the
    /// handovers per second, for callers that compare two runs.
    pub fn print(mut self, name: &str, elapsed: Duration) -> f64 {
        self.latencies.sort();
        let at = |q: usize| {
            self.latencies
                .get(self.latencies.len() * q / 100)
                .copied()
                .unwrap_or_default()
        };
        let (median, p90) = (at(50), at(90));
        let seconds = elapsed.as_secs_f64();
        let handovers = self.latencies.len() as f64 / seconds;
        println!(
            "{name:<45} {handovers:>8.0} handovers/s (holder changed), {:>8.0} acquisitions/s, \
             release-to-next-holder median {median:.2?} p90 {p90:.2?}",
            self.acquisitions as f64 / seconds,
        );
        handovers
    }
}

/// Records an acquisition by `task` and marks the release that follows at once; returns
/// the acquisition's number. Contender loops call it between acquiring and releasing, so
/// the handover latency runs from one task's release to the next task's acquisition.
pub fn acquired(stats: &Mutex<Handovers>, count: &watch::Sender<usize>, task: usize) -> usize {
    let mut stats = stats.lock().expect("handover stats");
    stats.acquired(task);
    stats.last_release = Some((task, Instant::now()));
    count.send_replace(stats.acquisitions);
    stats.acquisitions
}

/// A task that just released waits for another holder before it contends again, so every
/// acquisition is a handover to a waiter (as between processes that each lock now and then),
/// not the releaser winning its own key back.
pub async fn wait_for_next_holder(count: &watch::Sender<usize>, mine: usize, deadline: Instant) {
    let mut changes = count.subscribe();
    let _ = tokio::time::timeout_at(deadline.into(), changes.wait_for(|n| *n > mine)).await;
}

/// Eight tasks contend for one key for [`CONTENDED_FOR`], each handing the key over before
/// it competes again; `task` builds one contender's loop from its index, the shared
/// statistics, the acquisition counter and the deadline. Prints one line under `name` and
/// returns the handovers per second, for callers that compare two contenders (others
/// ignore it). Shared so every backend and peer crate is measured by the same harness.
pub async fn one_key<F, Fut>(name: &str, task: F) -> f64
where
    F: Fn(usize, Arc<Mutex<Handovers>>, Arc<watch::Sender<usize>>, Instant) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
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
        done.expect("contender task");
    }
    let stats = Arc::try_unwrap(stats)
        .ok()
        .expect("every contender has finished")
        .into_inner()
        .expect("handover stats");
    stats.print(name, started.elapsed())
}

/// Eight library clients (one per task, as separate processes would have), each made by
/// `connect`, contend for one key through [`one_key`]: the library's own contender loop,
/// the same for every backend. Returns the handovers per second.
pub async fn one_key_library<C, CFut>(name: &str, connect: C) -> f64
where
    C: Fn() -> CFut,
    CFut: Future<Output = LockClient> + Send + 'static,
{
    one_key(name, |task, stats, count, deadline| {
        let client = connect();
        async move {
            let client = client.await;
            while Instant::now() < deadline {
                let guard = client.lock("bench/one-key").await.expect("lock");
                let mine = acquired(&stats, &count, task);
                guard.release().await.expect("release");
                wait_for_next_holder(&count, mine, deadline).await;
            }
        }
    })
    .await
}
