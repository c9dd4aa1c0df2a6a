//! What a simulation run records: one line per event, in the order the events happened on
//! the run's single thread.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::lock_unpoisoned;
use lock_core::{ErrorKind, FencingToken};

use super::workload::{How, Key};
use super::Mode;
use crate::faults::{Fault, Op};

/// One recorded event: when (since the run began, on the core's clock), which task
/// (`None` for the harness itself) and what.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Time since the start of the run.
    pub at: Duration,
    /// The workload task, or `None` for the harness (faults, the final look at the store).
    pub task: Option<usize>,
    /// What happened.
    pub what: What,
}

/// Which API an acquisition went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `LockClient::lock` / `try_lock`: a guard of its own.
    Client,
    /// `LockOwner::lock` / `try_lock` of this owner: reentrant, shared with the owner's
    /// other tasks.
    Owner(usize),
    /// `LockClient::with_lock`: its grant is recorded when the body starts.
    Scoped,
    /// `LockClient::once`.
    Once {
        /// The ticket's `at_least`.
        at_least: Duration,
        /// The ticket's `at_most`.
        at_most: Duration,
    },
    /// `LockClient::idempotent`: its grant is recorded when the work starts.
    Idempotent,
}

/// How an idempotent call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `Execution::Ran` with this result.
    Ran(String),
    /// `Execution::Replayed` with this result.
    Replayed(String),
    /// `Execution::InProgress`.
    InProgress,
    /// `Execution::Failed`.
    Failed,
    /// An error.
    Error(ErrorKind),
}

/// The kinds of [`Event`]. `guard` numbers an acquisition within its task (a task's steps
/// may hold several guards at once: a re-entry inside a hold).
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// The run began, in this store mode.
    Began {
        /// The store's mode.
        mode: Mode,
    },
    /// An acquisition began.
    Asked {
        /// The acquisition.
        guard: usize,
        /// The key.
        key: Key,
        /// How long it may wait.
        how: How,
        /// Through which API.
        via: Via,
    },
    /// An acquisition ended with a guard (for `with_lock`: its body started; for
    /// `idempotent`: its work started). `valid_until` is the guard's own deadline.
    Granted {
        /// The acquisition.
        guard: usize,
        /// The key.
        key: Key,
        /// The guard's fencing token.
        token: FencingToken,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// An acquisition ended without a guard.
    Refused {
        /// The acquisition.
        guard: usize,
        /// The key.
        key: Key,
        /// Why.
        kind: ErrorKind,
    },
    /// The workload dropped an acquisition (or a `with_lock` or idempotent call) before
    /// it ended.
    Cancelled {
        /// The acquisition.
        guard: usize,
        /// The key.
        key: Key,
    },
    /// A manual renewal ended; `valid_until` is the guard's deadline after it.
    Renewed {
        /// The acquisition.
        guard: usize,
        /// The guard's token.
        token: FencingToken,
        /// The outcome.
        result: Result<(), ErrorKind>,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// The guard's (or once ticket's) `lost()` resolved.
    Lost {
        /// The acquisition.
        guard: usize,
        /// The guard's token.
        token: FencingToken,
    },
    /// The holder stopped using the lock and gave it back: by `release` (whose outcome
    /// follows as [`What::Released`]) or by dropping the guard; for a once ticket, its job
    /// ended and the ticket is finished or dropped. `valid_until` is the guard's deadline
    /// at that moment.
    Ended {
        /// The acquisition.
        guard: usize,
        /// The guard's token.
        token: FencingToken,
        /// Whether the guard (or ticket) was dropped rather than released (finished).
        dropped: bool,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// `release` (or a once ticket's `finish`) returned.
    Released {
        /// The acquisition.
        guard: usize,
        /// The guard's token.
        token: FencingToken,
        /// The outcome.
        result: Result<(), ErrorKind>,
    },
    /// A `with_lock` body ended: it finished, or it was dropped (stopped by a loss, or by
    /// the cancellation of the call).
    BodyEnded {
        /// The acquisition.
        guard: usize,
        /// The lock's token.
        token: FencingToken,
        /// Whether it ran to its end.
        finished: bool,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// `with_lock` returned after its body started.
    ScopedReturned {
        /// The acquisition.
        guard: usize,
        /// `Ok` for the body's value.
        result: Result<(), ErrorKind>,
    },
    /// A once request answered `Ok(None)`: the key ran or runs within its window.
    OnceTaken {
        /// The acquisition.
        guard: usize,
        /// The key.
        key: Key,
    },
    /// An idempotent call's work ended: it returned (a result or its own failure), or it
    /// was dropped with the call.
    WorkEnded {
        /// The acquisition.
        guard: usize,
        /// The lock's token.
        token: FencingToken,
        /// Whether it ran to its end.
        finished: bool,
        /// Whether it returned its own failure.
        failed: bool,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// An idempotent call returned.
    Executed {
        /// The acquisition.
        guard: usize,
        /// The key.
        key: Key,
        /// What it answered.
        outcome: Outcome,
    },
    /// The harness put a fault in force on one client.
    Faulted {
        /// The client's index.
        client: usize,
        /// The operation.
        op: Op,
        /// The fault.
        fault: Fault,
        /// For how many calls.
        times: u32,
    },
    /// The store ended the session holding `key` (session mode), freeing these keys.
    SessionEnded {
        /// The key whose holder's session was ended.
        key: Key,
        /// The keys that session held, with their tokens: all free now.
        freed: Vec<(Key, FencingToken)>,
    },
    /// A client's link to the store was cut (session mode).
    LinkCut {
        /// The client's index.
        client: usize,
    },
    /// A client's link to the store works again.
    LinkRestored {
        /// The client's index.
        client: usize,
    },
    /// The store went down for every client (a restart), keeping its state.
    StoreDown {
        /// Whether its requests go unanswered rather than fail at once.
        unanswered: bool,
    },
    /// The store is back.
    StoreUp,
    /// Every task ended; faults were healed.
    TasksEnded,
    /// As the tasks ended, this many waiters were still queued for the key (clean-ups on
    /// their way, or entries left behind).
    QueuedAtEnd {
        /// The key.
        key: Key,
        /// Live queue entries.
        waiters: usize,
    },
    /// The key's queue, not empty as the tasks ended, emptied (before any newcomer came).
    Drained {
        /// The key.
        key: Key,
    },
    /// After the settle time, the store still had this key held or queued for.
    Leftover {
        /// The key.
        key: Key,
        /// The holder's token, if held.
        token: Option<FencingToken>,
        /// Waiters in its queue, where the store says.
        waiters: Option<usize>,
    },
    /// The run did not finish within its time limit.
    Stuck,
}

/// The shared, append-only record of one run.
#[derive(Clone, Debug)]
pub struct History {
    origin: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History {
            origin: lock_core::backend::now(),
            events: Arc::default(),
        }
    }

    /// Records `what` for `task` now.
    pub fn record(&self, task: Option<usize>, what: What) {
        let at = lock_core::backend::now().saturating_duration_since(self.origin);
        lock_unpoisoned(&self.events).push(Event { at, task, what });
    }

    /// `instant` (on the core's clock) as time since the start of the run.
    pub fn since_start(&self, instant: Instant) -> Duration {
        instant.saturating_duration_since(self.origin)
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<Event> {
        lock_unpoisoned(&self.events).clone()
    }
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for event in self.events() {
            let task = event.task.map_or("  -".to_string(), |t| format!("t{t:<2}"));
            writeln!(f, "{:>9.3?} {task} {:?}", event.at, event.what)?;
        }
        Ok(())
    }
}
