//! What a simulation run records: one line per event, in the order the events happened on
//! the run's single thread.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::lock_unpoisoned;
use lock_core::{ErrorKind, FencingToken};

use super::workload::How;
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

/// The kinds of [`Event`].
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// An acquisition began.
    Asked {
        /// The key's index.
        key: usize,
        /// How long it may wait.
        how: How,
    },
    /// An acquisition ended with a guard. `valid_until` is the guard's own deadline.
    Granted {
        /// The key's index.
        key: usize,
        /// The guard's fencing token.
        token: FencingToken,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// An acquisition ended without a guard.
    Refused {
        /// The key's index.
        key: usize,
        /// Why.
        kind: ErrorKind,
    },
    /// The workload dropped an acquisition before it ended.
    Cancelled {
        /// The key's index.
        key: usize,
    },
    /// A manual renewal ended; `valid_until` is the guard's deadline after it.
    Renewed {
        /// The guard's token.
        token: FencingToken,
        /// The outcome.
        result: Result<(), ErrorKind>,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// The guard's `lost()` resolved.
    Lost {
        /// The guard's token.
        token: FencingToken,
    },
    /// The holder stopped using the lock and gave it back: by `release` (whose outcome
    /// follows as [`What::Released`]) or by dropping the guard. `valid_until` is the
    /// guard's deadline at that moment.
    Ended {
        /// The guard's token.
        token: FencingToken,
        /// Whether the guard was dropped rather than released.
        dropped: bool,
        /// The lease's local deadline, since the start of the run.
        valid_until: Duration,
    },
    /// `release` returned.
    Released {
        /// The guard's token.
        token: FencingToken,
        /// The outcome.
        result: Result<(), ErrorKind>,
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
    /// Every task ended; faults were healed.
    TasksEnded,
    /// As the tasks ended, this many waiters were still queued for the key (clean-ups on
    /// their way, or entries left behind).
    QueuedAtEnd {
        /// The key's index.
        key: usize,
        /// Live queue entries.
        waiters: usize,
    },
    /// The key's queue, not empty as the tasks ended, emptied (before any newcomer came).
    Drained {
        /// The key's index.
        key: usize,
    },
    /// After the settle time, the store still had this key held or queued for.
    Leftover {
        /// The key's index.
        key: usize,
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
