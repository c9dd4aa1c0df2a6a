//! The contract, checked on a recorded [`History`](super::History).
//!
//! Every check compares instants whose order a correct core cannot invert (a rival's grant
//! returns after the store granted it, which is after the previous lease's release began
//! or its store expiry, which is after that lease's local deadline), or allows
//! [`LATENESS`] for a timer to fire and [`WAIT_SLACK`] for what the contract grants a
//! wait. Runs play on the paused clock, where timers fire exactly on time however loaded
//! the machine is, so the allowances are what the contract promises, not what a busy
//! machine needs.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use lock_core::{ErrorKind, FencingToken};

use super::history::{Event, What};
use super::workload::{How, REQUEST_TIMEOUT};

/// How late `lost()` may resolve after the lease's deadline or a rival's grant: the
/// engine's timer fires at the deadline, and the watcher task that records the signal
/// runs a moment later on the same instant of the paused clock. (On real time this was a
/// second, which hid a lost signal up to a second late.)
pub const LATENESS: Duration = Duration::from_millis(1);

/// How far past its bound a wait may end: the contract gives a waiter on a fair store up
/// to 100 ms to leave the queue after its bound, and nothing else, and on the paused
/// clock every timer fires on time. (A core that measured part of a wait by the system
/// clock, which the paused clock does not move, overran by up to the whole bound.)
pub const WAIT_SLACK: Duration = Duration::from_millis(100);

/// Which guarantee a [`Violation`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// A grant while an earlier holder of the key still held it by its own deadline.
    Overlap,
    /// A key's tokens did not strictly increase in grant order.
    TokenOrder,
    /// A holder was not told of its loss (`lost()`) by a rival's grant or soon after its
    /// deadline passed.
    LostLate,
    /// A release said `Lost` while the guard's deadline was still ahead.
    ReleaseVerdict,
    /// `lost()` resolved for a lease whose release had succeeded.
    LostAfterRelease,
    /// An acquisition outlived its bound, or ended with a kind its wait cannot end with.
    Wait,
    /// Something was held or queued for in the store after every task ended.
    Leftover,
    /// The run did not finish within its time limit.
    Stuck,
}

/// One broken guarantee.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which guarantee.
    pub check: Check,
    /// What happened, with the instants involved.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.check, self.detail)
    }
}

/// One guard's life, assembled from its events.
#[derive(Debug)]
struct Life {
    task: usize,
    key: usize,
    token: FencingToken,
    granted_at: Duration,
    valid_until: Duration,
    ended_at: Option<Duration>,
    lost_at: Option<Duration>,
    /// When `release` returned `Ok`.
    released_at: Option<Duration>,
    /// Whether `release` failed unanswered: the lease may live on until its TTL.
    release_failed: bool,
}

impl Life {
    /// Until when the holder may act under the lock: its deadline, or when it gave the
    /// lock back if sooner.
    fn holds_until(&self) -> Duration {
        self.ended_at
            .map_or(self.valid_until, |end| end.min(self.valid_until))
    }
}

/// Every violation of the contract in `events`.
pub fn check(events: &[Event]) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut violation = |check, detail: String| found.push(Violation { check, detail });
    let mut asked: HashMap<usize, (Duration, How)> = HashMap::new();
    let mut lives: Vec<Life> = Vec::new();
    for event in events {
        let (at, task) = (event.at, event.task.unwrap_or(usize::MAX));
        // A task holds one guard at a time; a late `lost()` names its token.
        let life_of = |lives: &[Life], token: FencingToken| {
            lives
                .iter()
                .rposition(|life| life.task == task && life.token == token)
        };
        match &event.what {
            What::Asked { how, .. } => {
                asked.insert(task, (at, *how));
            }
            What::Cancelled { .. } => {
                asked.remove(&task);
            }
            What::Granted { key, token, valid_until } => {
                if let Some(detail) = late(asked.remove(&task), at) {
                    violation(Check::Wait, format!("t{task} granted k{key} {detail}"));
                }
                lives.push(Life {
                    task,
                    key: *key,
                    token: *token,
                    granted_at: at,
                    valid_until: *valid_until,
                    ended_at: None,
                    lost_at: None,
                    released_at: None,
                    release_failed: false,
                });
            }
            What::Refused { key, kind } => {
                let began = asked.remove(&task);
                if let Some(detail) = late(began, at) {
                    violation(Check::Wait, format!("t{task} refused k{key} {detail}"));
                }
                match began {
                    Some((_, how)) if !may_refuse(how, *kind) => violation(
                        Check::Wait,
                        format!("t{task} {how:?} on k{key} ended {kind:?}"),
                    ),
                    _ => {}
                }
            }
            What::Renewed { token, valid_until, .. } | What::Ended { token, valid_until, .. } => {
                if let Some(index) = life_of(&lives, *token) {
                    let life = &mut lives[index];
                    life.valid_until = life.valid_until.max(*valid_until);
                    if matches!(event.what, What::Ended { .. }) {
                        life.ended_at = Some(at);
                    }
                }
            }
            What::Lost { token } => {
                if let Some(index) = life_of(&lives, *token) {
                    let life = &mut lives[index];
                    life.lost_at.get_or_insert(at);
                    // The watcher task records a loss that fired during the release
                    // call a moment after it: only a loss well after counts.
                    if let Some(released) = life.released_at.filter(|r| at > *r + LATENESS) {
                        violation(
                            Check::LostAfterRelease,
                            format!("t{task} token {token}: released at {released:?}, lost() at {at:?}"),
                        );
                    }
                }
            }
            What::Released { token, result: Ok(()) } => {
                if let Some(index) = life_of(&lives, *token) {
                    lives[index].released_at = Some(at);
                }
            }
            What::Released { token, result: Err(ErrorKind::Unavailable) } => {
                if let Some(index) = life_of(&lives, *token) {
                    lives[index].release_failed = true;
                }
            }
            What::Released { token, result: Err(ErrorKind::Lost) } => {
                match life_of(&lives, *token).map(|index| &lives[index]) {
                    Some(life) if at < life.valid_until => violation(
                        Check::ReleaseVerdict,
                        format!(
                            "t{task} token {token}: release said Lost at {at:?}, deadline {:?}",
                            life.valid_until
                        ),
                    ),
                    _ => {}
                }
            }
            // A release the store did not answer leaves the lease to its TTL, as
            // documented: the caller was told.
            What::Leftover { key, token, .. }
                if lives.iter().any(|life| {
                    life.key == *key && Some(life.token) == *token && life.release_failed
                }) => {}
            What::Leftover { key, token, waiters } => violation(
                Check::Leftover,
                format!(
                    "k{key} not free after the settle time: holder token {token:?}, waiters {waiters:?}"
                ),
            ),
            What::Stuck => violation(Check::Stuck, format!("tasks still running at {at:?}")),
            _ => {}
        }
    }
    check_lives(&lives, &mut violation);
    found
}

/// How much an acquisition that began at `began` and ended at `ended` overran its bound,
/// if it did.
fn late(began: Option<(Duration, How)>, ended: Duration) -> Option<String> {
    let (began, how) = began?;
    let bound = match how {
        // A wait of zero is one try.
        How::Try | How::UpTo(Duration::ZERO) => REQUEST_TIMEOUT,
        How::UpTo(bound) => bound,
        How::Forever => return None,
    };
    let took = ended.saturating_sub(began);
    (took > bound + WAIT_SLACK).then(|| format!("after {took:?}, {how:?} (bound {bound:?})"))
}

/// Whether an acquisition waiting `how` may end without a guard with `kind`.
fn may_refuse(how: How, kind: ErrorKind) -> bool {
    match how {
        How::Try => matches!(kind, ErrorKind::HeldByAnother | ErrorKind::Unavailable),
        How::UpTo(_) => matches!(
            kind,
            ErrorKind::HeldByAnother | ErrorKind::TimedOut | ErrorKind::Unavailable
        ),
        How::Forever => false,
    }
}

/// The checks between the guards of one key.
fn check_lives(lives: &[Life], violation: &mut impl FnMut(Check, String)) {
    for (i, earlier) in lives.iter().enumerate() {
        let ran_out = earlier
            .ended_at
            .is_none_or(|end| end > earlier.valid_until + LATENESS);
        if ran_out
            && earlier
                .lost_at
                .is_none_or(|lost| lost > earlier.valid_until + LATENESS)
        {
            violation(
                Check::LostLate,
                format!(
                    "t{} token {}: deadline {:?} passed while held (ended {:?}), lost() at {:?}",
                    earlier.task,
                    earlier.token,
                    earlier.valid_until,
                    earlier.ended_at,
                    earlier.lost_at
                ),
            );
        }
        for later in lives[i + 1..]
            .iter()
            .filter(|later| later.key == earlier.key)
        {
            if later.granted_at < earlier.holds_until() {
                violation(
                    Check::Overlap,
                    format!(
                        "k{}: t{} token {} granted at {:?} while t{} token {} held it until {:?}",
                        later.key,
                        later.task,
                        later.token,
                        later.granted_at,
                        earlier.task,
                        earlier.token,
                        earlier.holds_until()
                    ),
                );
            }
            if later.token <= earlier.token {
                violation(
                    Check::TokenOrder,
                    format!(
                        "k{}: token {} (t{}) granted after token {} (t{})",
                        later.key, later.token, later.task, earlier.token, earlier.task
                    ),
                );
            }
            let still_held = earlier.ended_at.is_none_or(|end| end > later.granted_at);
            if still_held
                && earlier
                    .lost_at
                    .is_none_or(|lost| lost > later.granted_at + LATENESS)
            {
                violation(
                    Check::LostLate,
                    format!(
                        "k{}: t{} token {} granted at {:?}; t{} token {} still held its guard, lost() at {:?}",
                        later.key, later.task, later.token, later.granted_at, earlier.task,
                        earlier.token, earlier.lost_at
                    ),
                );
            }
        }
    }
}
