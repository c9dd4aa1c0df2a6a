//! The shared-hold workloads: a semaphore permit's cycle against the mutex's, tasks on a
//! semaphore of few permits, and readers and writers mixed on one reader-writer lock.

use std::time::Duration;

use distlock::{Error, LockClient};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::progress::Progress;
use super::report::{latency, rate};
use super::stats::Distribution;
use super::workload::{join_all, Plan};

/// Tasks on the semaphore workload, each with its own client.
pub const SEMAPHORE_TASKS: usize = 16;
/// The semaphore workload's permits.
pub const PERMITS: u32 = 4;
/// One operation in this many of the reader-writer workload is a write.
const WRITE_EVERY: u64 = 10;

/// One store's shared-hold results.
#[derive(Clone, Debug)]
pub struct SharedResult {
    /// Uncontended permit acquire+release latency (a semaphore of [`PERMITS`]).
    pub permit: Distribution,
    /// Permit cycles of [`SEMAPHORE_TASKS`] tasks on one semaphore of [`PERMITS`].
    pub semaphore: Cycles,
    /// Reads and writes (one in [`WRITE_EVERY`]) of `plan.tasks` tasks on one lock.
    pub readers_writers: Cycles,
    /// From a writer's request to its grant, in the reader-writer workload.
    pub writer_wait: Option<Distribution>,
}

/// Completed cycles of a contended workload and its wall time.
#[derive(Clone, Debug)]
pub struct Cycles {
    /// Completed acquire+release cycles.
    pub cycles: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Latency of one cycle, waiting included.
    pub latency: Option<Distribution>,
}

impl Cycles {
    fn per_second(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The three shared workloads on one store; `clients` has at least
/// [`SEMAPHORE_TASKS`] clients.
pub async fn measure(
    clients: &[LockClient],
    plan: &Plan,
    progress: &Progress,
) -> Result<SharedResult, Error> {
    let key = format!("{}/permit", plan.prefix);
    let warm_up = plan.runs / 10;
    progress.phase("permit", Some(warm_up + plan.runs), None);
    let mut samples = Vec::with_capacity(plan.runs);
    for run in 0..warm_up + plan.runs {
        let started = Instant::now();
        let permit = clients[0]
            .semaphore(&key, PERMITS)
            .no_wait()
            .ttl(plan.ttl)
            .await?;
        permit.release().await?;
        if run >= warm_up {
            samples.push(started.elapsed());
        }
        progress.advance();
    }
    let permit = Distribution::of(samples).expect("at least one run");
    progress.phase("semaphore", None, Some(plan.duration));
    let (semaphore, _) = contend(&clients[..SEMAPHORE_TASKS], plan, "semaphore", |_| {
        Hold::Permit
    })
    .await?;
    progress.phase("readers, writers", None, Some(plan.duration));
    let (readers_writers, writer_wait) = contend(&clients[..plan.tasks], plan, "rw", |n| {
        if n % WRITE_EVERY == 0 {
            Hold::Write
        } else {
            Hold::Read
        }
    })
    .await?;
    Ok(SharedResult {
        permit,
        semaphore,
        readers_writers,
        writer_wait,
    })
}

/// How one cycle of a contended workload holds its key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    Permit,
    Read,
    Write,
}

/// Every client cycling acquire+release on one key for `plan.duration`, holding it as
/// `hold(n)` says for its n-th cycle (numbered from the task's index, so the tasks' writes
/// do not line up); the cycles, and the waits of the write cycles.
async fn contend(
    clients: &[LockClient],
    plan: &Plan,
    name: &str,
    hold: fn(u64) -> Hold,
) -> Result<(Cycles, Option<Distribution>), Error> {
    let key = format!("{}/{name}", plan.prefix);
    let started = Instant::now();
    let deadline = started + plan.duration;
    let mut set = JoinSet::new();
    for (task, client) in clients.iter().enumerate() {
        let (client, key, ttl) = (client.clone(), key.clone(), plan.ttl);
        let first = task as u64;
        set.spawn(async move {
            let (mut cycles, mut writes) = (Vec::new(), Vec::new());
            let mut n = first;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok((cycles, writes));
                }
                let kind = hold(n);
                n += 1;
                let request = match kind {
                    Hold::Permit => client.semaphore(&key, PERMITS),
                    Hold::Read => client.read_lock(&key),
                    Hold::Write => client.write_lock(&key),
                };
                let cycle = Instant::now();
                let guard = match request.ttl(ttl).wait_up_to(left).await {
                    Ok(guard) => guard,
                    // The workload's end came during the wait.
                    Err(_) if Instant::now() >= deadline => return Ok((cycles, writes)),
                    Err(err) => return Err(err),
                };
                if kind == Hold::Write {
                    writes.push(cycle.elapsed());
                }
                guard.release().await?;
                cycles.push(cycle.elapsed());
            }
        });
    }
    let (cycles, writes): (Vec<_>, Vec<_>) = join_all(set).await?.into_iter().unzip();
    let cycles = cycles.concat();
    Ok((
        Cycles {
            cycles: cycles.len(),
            elapsed: started.elapsed(),
            latency: Distribution::of(cycles),
        },
        Distribution::of(writes.concat()),
    ))
}

/// The shared-holds table: one row per store (`-` where the store refuses them).
pub fn table(plan: &Plan, rows: &[(String, Distribution, Option<SharedResult>)]) -> String {
    let width = rows
        .iter()
        .map(|(name, ..)| name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "\n{:<width$}  {:^22}  {:^31}  {:^32}\n",
        "",
        "permit, uncontended",
        format!("{SEMAPHORE_TASKS} tasks, {PERMITS} permits"),
        format!("{} tasks, reads:writes 9:1", plan.tasks),
    );
    out.push_str(&format!(
        "{:<width$}  {:>10} {:>11}  {:>11} {:>9} {:>9}  {:>11} {:>20}\n",
        "store", "median", "vs mutex", "permits", "median", "p99", "operations", "writer wait p99"
    ));
    for (name, mutex, shared) in rows {
        let Some(shared) = shared else {
            out.push_str(&format!(
                "{name:<width$}  refuses semaphores and reader-writer locks\n"
            ));
            continue;
        };
        let cell = |d: Option<Distribution>, pick: fn(Distribution) -> Duration| {
            d.map_or_else(|| "-".to_string(), |d| latency(pick(d)))
        };
        out.push_str(&format!(
            "{name:<width$}  {:>10} {:>11}  {:>11} {:>9} {:>9}  {:>11} {:>20}\n",
            latency(shared.permit.p50),
            format!("{:.2}x", ratio(shared.permit.p50, mutex.p50)),
            rate(shared.semaphore.per_second()),
            cell(shared.semaphore.latency, |d| d.p50),
            cell(shared.semaphore.latency, |d| d.p99),
            rate(shared.readers_writers.per_second()),
            cell(shared.writer_wait, |d| d.p99),
        ));
    }
    out.push_str(
        "permit: try + release of one permit, its median against the uncontended mutex \
         cycle's above; the contended rows count completed acquire+release cycles, waits \
         included\n",
    );
    out
}

fn ratio(of: Duration, to: Duration) -> f64 {
    of.as_secs_f64() / to.as_secs_f64().max(1e-12)
}

/// One store's shared results as JSON (latencies in microseconds), `null` where refused.
pub fn to_json(plan: &Plan, shared: Option<&SharedResult>) -> serde_json::Value {
    let Some(shared) = shared else {
        return serde_json::Value::Null;
    };
    let cycles = |cycles: &Cycles, tasks: usize| {
        json!({
            "tasks": tasks,
            "cycles": cycles.cycles,
            "seconds": cycles.elapsed.as_secs_f64(),
            "cycles_per_s": cycles.per_second(),
            "latency": cycles.latency.map(Distribution::to_json),
        })
    };
    json!({
        "permit_uncontended": shared.permit.to_json(),
        "semaphore": {
            "permits": PERMITS,
            "run": cycles(&shared.semaphore, SEMAPHORE_TASKS),
        },
        "readers_writers": {
            "writes_per_ops": format!("1/{WRITE_EVERY}"),
            "run": cycles(&shared.readers_writers, plan.tasks),
            "writer_wait": shared.writer_wait.map(Distribution::to_json),
        },
    })
}
