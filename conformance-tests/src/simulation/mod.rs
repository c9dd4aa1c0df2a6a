//! Seeded simulation of the core: randomized workloads of a few clients on a few keys,
//! with faults, recorded as a [`History`] and checked against the contract by [`check`].
//!
//! A run with seed `S` draws everything it does from `S` alone ([`Plan::from_seed`]): the
//! clients, the keys (lock keys, a once key, idempotency keys), the reentrant owners, each
//! task's steps and the blows struck on the store. The steps:
//!
//! - holds: `try_lock`, bounded and unbounded waits, renewed by the engine or by hand,
//!   released or dropped, acquisitions cancelled at a random instant; a task may take its
//!   guards through a [`LockOwner`] shared with other tasks, and a hold may take its key
//!   again (a re-entry through the owner, or a second acquisition through the client,
//!   which must be refused while held), ending before or after the outer hold;
//! - `with_lock` bodies, whose start and end (or stop) are recorded, cancelled at random;
//! - `once` tickets, finished or dropped, their job sometimes outliving `at_most`;
//! - `idempotent` runs (waiting or not, work that fails now and then, calls cancelled
//!   mid-run), whose work start, end and answer are recorded.
//!
//! The blows: faults on one client's operation through its [`FaultyBackend`] (delays,
//! failures, black holes, replies lost or late, requests landing late); in session mode,
//! the store ending the session holding a key (`MemoryBackend::end_session_holding`) and
//! a client's link cut for a while (`MemoryLink::cut`, then `restore`); and a store
//! restart: every operation of every client fails (or goes unanswered), and in session
//! mode every link is cut, for a drawn time, the store's state kept. The store is the
//! in-memory backend in plain, fair or session mode (`S % 3`). The run plays on one
//! thread (a `current_thread` Tokio runtime, the core's jitter seeded with
//! `fastrand::seed(S)`), then heals the faults, lets a newcomer wait for each key (it must
//! get every key, the pattern keys included, within [`SETTLE`]) and checks the history.
//!
//! [`check`] judges holds per ownership (a grant and its re-entries by one owner are one
//! holder; different owners and clients are rivals): no overlap, rising tokens, loss told
//! in time (`lost()`, or a `with_lock` body stopped), release verdicts, wait bounds; a
//! re-entry keeps its owner's token; a `with_lock` body stopped by a loss makes the call
//! say `Lost`; no once ticket within an earlier ticket's window; one idempotent result per
//! key, given to every later caller, and no work under a live lock after it; a key ended
//! by the store's session end is judged as documented (its holder may hear of it after a
//! rival's grant, by its deadline); nothing left behind.
//!
//! # What is replayable, and what is not
//!
//! The plan is a pure function of the seed (`a_seed_plays_one_plan`), and so is the run:
//! it plays on a current-thread runtime whose clock is paused, and the core reads that
//! clock (`lock_core::backend::now`), so leases, wait bounds, the renewal schedule and the
//! memory store's expiry all move on simulated time. Time advances only when every task
//! waits, so a 10 s lease costs no real time, a run takes about a millisecond, and a
//! seed replays its whole history, instants included (`a_seed_replays_its_history`). The
//! core's jitter draws from this thread's generator, seeded by the run. Lease ids still
//! come from the OS's entropy and hash maps use a random hasher; neither changes what
//! happens when (the replays above are exact).
//!
//! The checker allows only what the contract grants ([`LATENESS`] for `lost()`,
//! [`WAIT_SLACK`] for a bounded wait): on the paused clock timers fire on time. The TTLs
//! are 300-600 ms, [`LONG_TTL`] for one lease in four, so that a lease left behind
//! outlives [`SETTLE`].
//!
//! The simulation found a defect of the core, now fixed: a bounded wait dropped while its
//! leave of the queue was in flight stayed queued (`QueuePlace::leave` took its clean-up
//! before awaiting the request). Seed 2231 of the generator before owners and patterns
//! found it; the test `a_wait_dropped_while_leaving_the_queue_leaves_it` keeps it fixed.
//! The defects it found since are listed in `docs/contract.md`.
//!
//! A run may also break the core itself ([`Defect::Core`], `lock_core::defects`), to
//! prove the checker catches a broken engine and not only a broken store.

mod broken;
pub mod checker;
mod history;
mod shrink;
mod workload;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::backend::{DynBackend, LockBackend};
use lock_core::memory::MemoryLink;
use lock_core::{LockClient, LockKey, LockOwner, MemoryBackend};

pub use broken::{Broken, Defect};
pub use checker::{check, Check, Violation, LATENESS, WAIT_SLACK};
pub use history::{Event, History, Outcome, Via, What};
pub use lock_core::defects::CoreDefect;
pub use shrink::shrink;
pub use workload::{
    Blow, End, Hold, How, IdempotentCall, Key, OnceJob, Plan, Reentry, Scoped, Step, Strike, Task,
    LONG_TTL, REQUEST_TIMEOUT,
};

use workload::{Hands, Player};

use crate::faults::FaultyBackend;

/// How long every key has, after the last task ended and the faults were healed, to be
/// free for a newcomer: the longest TTL, a request timeout for the second clean-up
/// release, and room for clean-up retries.
pub const SETTLE: Duration = Duration::from_secs(5);

/// The longest the tasks of one run may take before the run counts as stuck: far beyond
/// a run's few seconds, even with waits behind long leases whose release failed.
pub const RUN_LIMIT: Duration = Duration::from_secs(60);

/// [`RUN_LIMIT`] for a broken store, whose runs need only show the defect.
const BROKEN_RUN_LIMIT: Duration = Duration::from_secs(10);

/// The in-memory store's modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Waiters poll, woken by release notifications.
    Plain,
    /// A fair (FIFO) queue.
    Fair,
    /// A fair queue, leases kept by client sessions.
    Session,
}

impl Mode {
    /// The mode seed `seed` runs in.
    pub fn of_seed(seed: u64) -> Mode {
        [Mode::Plain, Mode::Fair, Mode::Session][(seed % 3) as usize]
    }

    fn store(self) -> MemoryBackend {
        match self {
            Mode::Plain => MemoryBackend::new(),
            Mode::Fair => MemoryBackend::fair(),
            Mode::Session => MemoryBackend::fair().with_sessions(),
        }
    }
}

/// One finished run.
#[derive(Debug)]
pub struct Run {
    /// Its seed.
    pub seed: u64,
    /// The store's mode.
    pub mode: Mode,
    /// What it played.
    pub plan: Plan,
    /// What happened.
    pub history: History,
    /// What the checker found.
    pub violations: Vec<Violation>,
}

/// Runs seed `seed` in its mode on a correct store.
pub fn run_seed(seed: u64) -> Run {
    run(seed, Mode::of_seed(seed), None)
}

/// Runs seed `seed` in `mode`, the store broken by `defect` if any. Builds its own
/// runtime: call it on a thread of its own (not from async code).
pub fn run(seed: u64, mode: Mode, defect: Option<Defect>) -> Run {
    run_plan(seed, Plan::from_seed(seed), mode, defect)
}

/// Plays `plan` (seed `seed`'s, or one shrunk from it: the seed still drives the core's
/// jitter) in `mode`, the store broken by `defect` if any.
pub fn run_plan(seed: u64, plan: Plan, mode: Mode, defect: Option<Defect>) -> Run {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    // The core's jitter draws from this thread's generator, and its defect switch is this
    // thread's: the runtime's only thread.
    fastrand::seed(seed);
    lock_core::defects::set(match defect {
        Some(Defect::Core(core)) => Some(core),
        _ => None,
    });
    // On the paused clock the core and the history read: created inside the runtime.
    let history = runtime.block_on(async { History::new() });
    runtime.block_on(play(mode, &plan, defect, &history));
    drop(runtime);
    lock_core::defects::set(None);
    let violations = check(&history.events());
    Run {
        seed,
        mode,
        plan,
        history,
        violations,
    }
}

async fn play(mode: Mode, plan: &Plan, defect: Option<Defect>, history: &History) {
    history.record(None, What::Began { mode });
    let store = mode.store();
    let first_tokens = Arc::new(Mutex::new(HashMap::new()));
    let memory: Vec<MemoryBackend> = (0..plan.clients).map(|_| store.client()).collect();
    let links: Vec<_> = memory.iter().map(MemoryBackend::link).collect();
    let backends: Vec<Arc<FaultyBackend>> = memory
        .into_iter()
        .map(|client| {
            let client: DynBackend = Arc::new(client);
            FaultyBackend::new(match defect {
                Some(defect) => Arc::new(Broken::new(client, defect, first_tokens.clone())),
                None => client,
            })
        })
        .collect();
    let clients: Vec<LockClient> = backends
        .iter()
        .map(|b| LockClient::new(b.clone()))
        .collect();
    let owners: Vec<LockOwner> = plan
        .owners
        .iter()
        .map(|client| clients[*client].owner())
        .collect();
    let striker = tokio::spawn(workload::strike_all(
        plan.strikes.clone(),
        Hands {
            backends: backends.clone(),
            links: links.clone(),
            store: store.clone(),
            keys: plan.all_keys(),
            history: history.clone(),
        },
    ));
    let tasks: Vec<_> = plan
        .tasks
        .iter()
        .enumerate()
        .map(|(index, task)| {
            let owner = task.owner.map(|owner| (owner, owners[owner].clone()));
            let player = Player::new(index, clients[task.client].clone(), owner, history.clone());
            tokio::spawn(player.play(task.steps.clone()))
        })
        .collect();
    let all = async {
        for task in tasks {
            let _ = task.await;
        }
    };
    let limit = defect.map_or(RUN_LIMIT, |_| BROKEN_RUN_LIMIT);
    if tokio::time::timeout(limit, all).await.is_err() {
        history.record(None, What::Stuck);
    }
    striker.abort();
    backends.iter().for_each(|backend| backend.heal());
    links.iter().flatten().for_each(MemoryLink::restore);
    history.record(None, What::TasksEnded);
    settle(&plan.all_keys(), &store, history).await;
}

/// Lets a newcomer on a fresh, healthy client wait up to [`SETTLE`] for each key; a key
/// it cannot get is a leftover (a lease or queue entry nobody owns any more).
async fn settle(keys: &[Key], store: &MemoryBackend, history: &History) {
    let newcomer = LockClient::new(store.client());
    for &key in keys {
        let name = key.name();
        if let Ok(lock_key) = LockKey::new(&name) {
            drain(key, &lock_key, store, history).await;
        }
        match newcomer.lock(&name).wait_up_to(SETTLE).await {
            Ok(guard) => {
                let _ = guard.release().await;
            }
            Err(_) => {
                let info = match LockKey::new(&name) {
                    Ok(key) => store.inspect(&key).await.ok().flatten(),
                    Err(_) => None,
                };
                history.record(
                    None,
                    What::Leftover {
                        key,
                        token: info.as_ref().map(|info| info.token),
                        waiters: info.and_then(|info| info.waiters),
                    },
                );
            }
        }
    }
}

/// Records who still waits in `key`'s queue as the tasks end (a clean-up on its way: a
/// cancelled waiter's leave, say) and when the queue empties, if it does within
/// [`SETTLE`]: a check made at the end would race these clean-ups, and the history shows
/// by how much.
async fn drain(index: Key, key: &LockKey, store: &MemoryBackend, history: &History) {
    let waiters = store.queued(key);
    if waiters == 0 {
        return;
    }
    history.record(
        None,
        What::QueuedAtEnd {
            key: index,
            waiters,
        },
    );
    let step = Duration::from_millis(5);
    let deadline = tokio::time::Instant::now() + SETTLE;
    while store.queued(key) > 0 {
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(step).await;
    }
    history.record(None, What::Drained { key: index });
}

/// The seeds an environment variable asks for: `DISTLOCK_SIM_SEED=S` (one seed, its
/// history shown) or `DISTLOCK_SIM_SEEDS=A..B`; `None` when neither is set.
///
/// # Errors
/// A message when a variable is set but is not a seed or a range.
pub fn seeds_from_env() -> Result<Option<(std::ops::Range<u64>, bool)>, String> {
    if let Ok(seed) = std::env::var("DISTLOCK_SIM_SEED") {
        let seed: u64 = seed
            .trim()
            .parse()
            .map_err(|_| format!("DISTLOCK_SIM_SEED={seed:?} is not a number"))?;
        return Ok(Some((seed..seed + 1, true)));
    }
    let Ok(range) = std::env::var("DISTLOCK_SIM_SEEDS") else {
        return Ok(None);
    };
    let bad = || format!("DISTLOCK_SIM_SEEDS={range:?} is not a range A..B");
    let (start, end) = range.trim().split_once("..").ok_or_else(bad)?;
    let start = start.parse().map_err(|_| bad())?;
    let end = end.parse().map_err(|_| bad())?;
    Ok(Some((start..end, false)))
}

/// The one-line command that replays `seed` with its history shown.
pub fn replay_command(seed: u64) -> String {
    format!(
        "DISTLOCK_SIM_SEED={seed} cargo test -p conformance-tests --all-features --test simulation -- --nocapture seeds"
    )
}
