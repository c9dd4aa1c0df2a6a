//! The three workloads, the same on every store. Each contending task has a client of its
//! own (its own connections), as separate processes would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, ErrorKind, LockClient};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::progress::Progress;
use super::stats::Distribution;

/// What the workloads are run with.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Timed cycles of the uncontended workload.
    pub runs: usize,
    /// Tasks of the contended workloads.
    pub tasks: usize,
    /// How long each contended workload runs.
    pub duration: Duration,
    /// Lease TTL.
    pub ttl: Duration,
    /// Prefix of every key, unique to this run.
    pub prefix: String,
}

/// Tasks cycling lock+release on keys of their own.
#[derive(Clone, Debug)]
pub struct Throughput {
    /// Completed lock+release cycles.
    pub cycles: usize,
    /// Wall time of the workload.
    pub elapsed: Duration,
    /// Latency of one cycle.
    pub latency: Option<Distribution>,
}

/// Tasks contending for one key.
#[derive(Clone, Debug)]
pub struct Handovers {
    /// Acquisitions, including a releaser winning the key back.
    pub acquisitions: usize,
    /// Acquisitions by another task than the last holder.
    pub handovers: usize,
    /// Wall time of the workload.
    pub elapsed: Duration,
    /// From the moment a holder started its release to the next holder's grant.
    pub latency: Option<Distribution>,
}

/// Uncontended `try_lock` + `release` of one key, one at a time.
pub async fn uncontended(
    client: &LockClient,
    plan: &Plan,
    progress: &Progress,
) -> Result<Distribution, Error> {
    let key = format!("{}/uncontended", plan.prefix);
    let warm_up = plan.runs / 10;
    progress.phase("uncontended", Some(warm_up + plan.runs), None);
    let mut samples = Vec::with_capacity(plan.runs);
    for run in 0..warm_up + plan.runs {
        let started = Instant::now();
        client.try_lock(&key).ttl(plan.ttl).await?.release().await?;
        if run >= warm_up {
            samples.push(started.elapsed());
        }
        progress.advance();
    }
    Ok(Distribution::of(samples).expect("at least one run"))
}

/// `plan.tasks` tasks, each on its own key, cycling for `plan.duration`.
pub async fn distinct_keys(
    clients: &[LockClient],
    plan: &Plan,
    progress: &Progress,
) -> Result<Throughput, Error> {
    progress.phase("distinct keys", None, Some(plan.duration));
    let started = Instant::now();
    let deadline = started + plan.duration;
    let mut set = JoinSet::new();
    for (task, client) in clients.iter().enumerate() {
        let (client, key, ttl) = (
            client.clone(),
            format!("{}/distinct/{task}", plan.prefix),
            plan.ttl,
        );
        set.spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < deadline {
                let cycle = Instant::now();
                client.lock(&key).ttl(ttl).await?.release().await?;
                samples.push(cycle.elapsed());
            }
            Ok::<_, Error>(samples)
        });
    }
    let samples = join_all(set).await?.concat();
    Ok(Throughput {
        cycles: samples.len(),
        elapsed: started.elapsed(),
        latency: Distribution::of(samples),
    })
}

/// `plan.tasks` tasks contending for one key for `plan.duration`. A releaser waits (until
/// the end) for someone else to take the key before it tries again, so each acquisition
/// is a handover, as between processes that each lock now and then, not the releaser
/// winning its own key back.
pub async fn one_key(
    clients: &[LockClient],
    plan: &Plan,
    progress: &Progress,
) -> Result<Handovers, Error> {
    progress.phase("one key", None, Some(plan.duration));
    let key = format!("{}/one", plan.prefix);
    let book = Arc::new(Mutex::new(Book::default()));
    let acquisitions = Arc::new(watch::channel(0usize).0);
    let started = Instant::now();
    let deadline = started + plan.duration;
    let mut set = JoinSet::new();
    for (task, client) in clients.iter().enumerate() {
        let (client, key, ttl) = (client.clone(), key.clone(), plan.ttl);
        let (book, acquisitions) = (Arc::clone(&book), Arc::clone(&acquisitions));
        set.spawn(async move {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Vec::new());
                }
                let guard = match client.lock(&key).ttl(ttl).wait_up_to(left).await {
                    Ok(guard) => guard,
                    Err(err) if err.kind() == ErrorKind::TimedOut => return Ok(Vec::new()),
                    // A wait bound that ends during a store request ends it as unanswered
                    // (Unavailable): at the end of the workload that is just the end.
                    Err(_) if Instant::now() >= deadline => return Ok(Vec::new()),
                    Err(err) => return Err(err),
                };
                let mine = {
                    let mut book = lock(&book);
                    book.acquired(task);
                    book.last_release = Some((task, Instant::now()));
                    book.acquisitions
                };
                acquisitions.send_replace(mine);
                guard.release().await?;
                let mut changes = acquisitions.subscribe();
                let _ = tokio::time::timeout_at(deadline, changes.wait_for(|count| *count > mine))
                    .await;
            }
        });
    }
    join_all::<Vec<Duration>>(set).await?;
    let elapsed = started.elapsed();
    let book = std::mem::take(&mut *lock(&book));
    Ok(Handovers {
        acquisitions: book.acquisitions,
        handovers: book.latencies.len(),
        elapsed,
        latency: Distribution::of(book.latencies),
    })
}

/// The one-key workload's shared record.
#[derive(Default)]
struct Book {
    /// Who released last, and when the release started.
    last_release: Option<(usize, Instant)>,
    latencies: Vec<Duration>,
    acquisitions: usize,
}

impl Book {
    fn acquired(&mut self, task: usize) {
        self.acquisitions += 1;
        if let Some((by, at)) = self.last_release.take() {
            if by != task {
                self.latencies.push(at.elapsed());
            }
        }
    }
}

fn lock(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every task's result; the first error (a panicked task is an internal error).
pub(super) async fn join_all<T: 'static>(
    mut set: JoinSet<Result<T, Error>>,
) -> Result<Vec<T>, Error> {
    let mut results = Vec::with_capacity(set.len());
    while let Some(joined) = set.join_next().await {
        let result = joined.map_err(|err| {
            Error::new(ErrorKind::Internal, format!("a bench task failed: {err}"))
        })?;
        results.push(result?);
    }
    Ok(results)
}
