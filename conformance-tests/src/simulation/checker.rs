//! The contract, checked on a recorded [`History`](super::History).
//!
//! Every check compares instants whose order a correct core cannot invert (a rival's grant
//! returns after the store granted it, which is after the previous lease's release began
//! or its store expiry, which is after that lease's local deadline), or allows
//! [`LATENESS`] for a timer to fire and [`WAIT_SLACK`] for what the contract grants a
//! wait. Runs play on the paused clock, where timers fire exactly on time however loaded
//! the machine is, so the allowances are what the contract promises, not what a busy
//! machine needs.
//!
//! Holds are judged per *ownership*: one grant, and every re-entry of it by the same
//! reentrant owner (same key, same token, while one of its guards is still out). An
//! ownership ends with the last of its guards; mutual exclusion and token order are
//! checked between ownerships, so a re-entry is not an overlap, while two owners, or an
//! owner and a client, are rivals like any two clients.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use lock_core::{ErrorKind, FencingToken};

use super::history::{Event, Outcome, Via, What};
use super::workload::{How, Key, REQUEST_TIMEOUT};
use super::Mode;

/// How late `lost()` may resolve after the lease's deadline or a rival's grant (and a
/// `with_lock` body stop after it): the engine's timer fires at the first tick of Tokio's
/// millisecond timer wheel at or after the deadline, and the watcher task that records
/// the signal runs on that same instant of the paused clock. (On real time this was a
/// second, which hid a lost signal up to a second late.)
pub const LATENESS: Duration = Duration::from_millis(2);

/// How far past its bound a wait may end: the contract gives a waiter on a fair store up
/// to 100 ms to leave the queue after its bound, and nothing else, and on the paused
/// clock every timer fires on time. (A core that measured part of a wait by the system
/// clock, which the paused clock does not move, overran by up to the whole bound.)
pub const WAIT_SLACK: Duration = Duration::from_millis(100);

/// Which guarantee a [`Violation`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// A grant while another ownership of the key still held it by its own deadline.
    Overlap,
    /// A key's tokens did not strictly increase from one ownership to the next.
    TokenOrder,
    /// A holder was not told of its loss (`lost()`, or a `with_lock` body stopped) by a
    /// rival's grant or soon after its deadline passed.
    LostLate,
    /// A release said `Lost` while the guard's deadline was still ahead, or `Ok` after
    /// `lost()` had resolved.
    ReleaseVerdict,
    /// `lost()` resolved for a lease whose release had succeeded.
    LostAfterRelease,
    /// An acquisition outlived its bound, or ended with a kind its wait cannot end with.
    Wait,
    /// A reentrant owner that held a key was granted it under another token.
    Reentry,
    /// A `with_lock` body stopped by a loss, and the call did not say `Lost`.
    Scoped,
    /// A once-per-window key was granted again within its window, or answered "taken"
    /// with no window open.
    Once,
    /// Idempotent work ran after its result was recorded, or callers were given results
    /// that are not the one recorded.
    Idempotent,
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

/// An acquisition (or call) as it was asked for.
#[derive(Clone, Copy, Debug)]
struct Ask {
    at: Duration,
    key: Key,
    how: How,
    via: Via,
}

/// One guard's life (or a ticket's, a `with_lock` body's, an idempotent run's),
/// assembled from its events.
#[derive(Debug)]
struct Life {
    task: usize,
    guard: usize,
    via: Via,
    token: FencingToken,
    /// For a body or work: when it started, which is no earlier than the grant.
    granted_at: Duration,
    valid_until: Duration,
    /// When the holder stopped using the lock and began to give it back.
    ended_at: Option<Duration>,
    /// When it learned of a loss: `lost()`, or a `with_lock` body stopped by it.
    lost_at: Option<Duration>,
    /// When the release (or finish, or the call) returned, and what it said.
    released: Option<(Duration, Result<(), ErrorKind>)>,
    /// Whether `release` failed unanswered: the lease may live on until its TTL.
    release_failed: bool,
    /// A once ticket dropped unfinished.
    dropped: bool,
    /// The call was dropped by the workload (its body stopped for that, not for a loss).
    cancelled: bool,
    /// A `with_lock` body stopped before its end (not by a cancellation).
    stopped: bool,
    /// Idempotent work that ended with its own failure / ran to its end.
    failed: bool,
    finished: bool,
    ownership: usize,
}

impl Life {
    /// Whether the holder hears of a loss (a guard's or ticket's `lost()`, a body's stop).
    fn watched(&self) -> bool {
        self.via != Via::Idempotent
    }
}

/// One grant and its re-entries.
#[derive(Debug)]
struct Ownership {
    key: Key,
    token: FencingToken,
    owner: Option<usize>,
    lives: Vec<usize>,
    /// When the store ended the session that held it.
    revoked_at: Option<Duration>,
}

#[derive(Default)]
struct Checker {
    found: Vec<Violation>,
    session: bool,
    asks: HashMap<(usize, usize), Ask>,
    /// Calls that ended without a guard, or were cancelled: (task, guard) -> when.
    closed: HashMap<(usize, usize), Duration>,
    lives: Vec<Life>,
    by_guard: HashMap<(usize, usize), usize>,
    ownerships: Vec<Ownership>,
    /// Keys (and tokens) the store freed by ending a session, and when.
    revoked: HashMap<(Key, FencingToken), Duration>,
    /// `Ok(None)` answers of once requests: (task, guard, when).
    once_taken: Vec<(usize, usize, Duration)>,
    /// Idempotent calls' answers: (task, guard) -> (when, what).
    executed: HashMap<(usize, usize), (Duration, Outcome)>,
}

/// Every violation of the contract in `events`.
pub fn check(events: &[Event]) -> Vec<Violation> {
    let mut checker = Checker::default();
    for event in events {
        checker.event(event);
    }
    checker.finish();
    checker.found
}

impl Checker {
    fn violation(&mut self, check: Check, detail: String) {
        self.found.push(Violation { check, detail });
    }

    fn life(&self, task: usize, guard: usize) -> Option<usize> {
        self.by_guard.get(&(task, guard)).copied()
    }

    fn ownership_of(&self, life: usize) -> &Ownership {
        &self.ownerships[self.lives[life].ownership]
    }

    /// The ownership's deadline: the latest any of its guards saw.
    fn valid_until(&self, ownership: &Ownership) -> Duration {
        ownership
            .lives
            .iter()
            .map(|life| self.lives[*life].valid_until)
            .max()
            .unwrap_or_default()
    }

    /// When the ownership's holder learned of a loss first.
    fn lost_at(&self, ownership: &Ownership) -> Option<Duration> {
        ownership
            .lives
            .iter()
            .filter_map(|life| self.lives[*life].lost_at)
            .min()
    }

    /// When the last of its guards was given back, once all were.
    fn ended_at(&self, ownership: &Ownership) -> Option<Duration> {
        ownership
            .lives
            .iter()
            .map(|life| self.lives[*life].ended_at)
            .try_fold(Duration::ZERO, |latest, ended| ended.map(|e| latest.max(e)))
    }

    /// Until when the holder may act under the lock: its deadline, or when it gave the
    /// lock back, was told it is lost, or the store ended its session, whichever is first.
    fn holds_until(&self, ownership: &Ownership) -> Duration {
        [
            Some(self.valid_until(ownership)),
            self.ended_at(ownership),
            self.lost_at(ownership),
            ownership.revoked_at,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_default()
    }

    fn revoked_by(&self, ownership: &Ownership, at: Duration) -> bool {
        ownership.revoked_at.is_some_and(|revoked| revoked <= at)
    }

    fn event(&mut self, event: &Event) {
        let (at, task) = (event.at, event.task.unwrap_or(usize::MAX));
        match &event.what {
            What::Began { mode } => self.session = *mode == Mode::Session,
            What::Asked {
                guard,
                key,
                how,
                via,
            } => {
                let ask = Ask {
                    at,
                    key: *key,
                    how: *how,
                    via: *via,
                };
                self.asks.insert((task, *guard), ask);
            }
            What::Cancelled { guard, .. } => {
                self.closed.insert((task, *guard), at);
                if let Some(life) = self.life(task, *guard) {
                    self.lives[life].cancelled = true;
                }
            }
            What::Granted {
                guard,
                key,
                token,
                valid_until,
            } => self.granted(at, task, *guard, *key, *token, *valid_until),
            What::Refused { guard, key, kind } => {
                self.closed.insert((task, *guard), at);
                let Some(ask) = self.asks.get(&(task, *guard)).copied() else {
                    return;
                };
                if let Some(detail) = late(ask, at) {
                    self.violation(Check::Wait, format!("t{task} refused {key} {detail}"));
                }
                if !self.may_refuse(ask, *kind) {
                    let check = match ask.via {
                        Via::Once { .. } => Check::Once,
                        _ => Check::Wait,
                    };
                    self.violation(
                        check,
                        format!("t{task} {:?} {:?} on {key} ended {kind:?}", ask.via, ask.how),
                    );
                }
            }
            What::OnceTaken { guard, key } => {
                self.closed.insert((task, *guard), at);
                if let Some(detail) = self.asks.get(&(task, *guard)).and_then(|a| late(*a, at)) {
                    self.violation(Check::Wait, format!("t{task} once {key} {detail}"));
                }
                self.once_taken.push((task, *guard, at));
            }
            What::Renewed {
                guard, valid_until, ..
            } => {
                if let Some(life) = self.life(task, *guard) {
                    let life = &mut self.lives[life];
                    life.valid_until = life.valid_until.max(*valid_until);
                }
            }
            What::Ended {
                guard,
                dropped,
                valid_until,
                ..
            } => {
                if let Some(life) = self.life(task, *guard) {
                    let life = &mut self.lives[life];
                    life.valid_until = life.valid_until.max(*valid_until);
                    life.ended_at = Some(at);
                    life.dropped = *dropped;
                }
            }
            What::BodyEnded {
                guard,
                finished,
                valid_until,
                ..
            } => {
                if let Some(life) = self.life(task, *guard) {
                    let life = &mut self.lives[life];
                    life.valid_until = life.valid_until.max(*valid_until);
                    life.ended_at = Some(at);
                    life.finished = *finished;
                    if !finished && !life.cancelled {
                        // Only a loss stops a body the caller did not drop.
                        life.stopped = true;
                        life.lost_at.get_or_insert(at);
                    }
                }
            }
            What::WorkEnded {
                guard,
                finished,
                failed,
                valid_until,
                ..
            } => {
                if let Some(life) = self.life(task, *guard) {
                    let life = &mut self.lives[life];
                    life.valid_until = life.valid_until.max(*valid_until);
                    life.ended_at = Some(at);
                    life.finished = *finished;
                    life.failed = *failed;
                }
            }
            What::Lost { guard, .. } => {
                if let Some(life) = self.life(task, *guard) {
                    self.lives[life].lost_at.get_or_insert(at);
                }
            }
            What::Released { guard, result, .. } => self.released(at, task, *guard, *result),
            What::ScopedReturned { guard, result } => {
                self.closed.insert((task, *guard), at);
                let Some(life) = self.life(task, *guard) else {
                    return;
                };
                if self.lives[life].stopped && *result != Err(ErrorKind::Lost) {
                    self.violation(
                        Check::Scoped,
                        format!(
                            "t{task} with_lock: its body was stopped by a loss at {:?}, the call said {result:?}",
                            self.lives[life].ended_at
                        ),
                    );
                }
                if let Err(kind) = result {
                    if !matches!(kind, ErrorKind::Lost | ErrorKind::Unavailable) {
                        self.violation(
                            Check::Scoped,
                            format!("t{task} with_lock ended {kind:?} after its body ran"),
                        );
                    }
                }
                self.released(at, task, *guard, *result);
            }
            What::Executed { guard, outcome, .. } => {
                self.closed.insert((task, *guard), at);
                self.executed.insert((task, *guard), (at, outcome.clone()));
                if let Outcome::Error(ErrorKind::Lost) = outcome {
                    self.released(at, task, *guard, Err(ErrorKind::Lost));
                }
            }
            What::SessionEnded { freed, .. } => {
                for (key, token) in freed {
                    self.revoked.entry((*key, *token)).or_insert(at);
                    for ownership in &mut self.ownerships {
                        if ownership.key == *key && ownership.token == *token {
                            ownership.revoked_at.get_or_insert(at);
                        }
                    }
                }
            }
            // A release the store did not answer leaves the lease to its TTL, as
            // documented: the caller was told.
            What::Leftover { key, token, .. }
                if self.lives.iter().any(|life| {
                    life.release_failed
                        && Some(life.token) == *token
                        && self.ownership_of_life(life).key == *key
                }) => {}
            What::Leftover {
                key,
                token,
                waiters,
            } => self.violation(
                Check::Leftover,
                format!(
                    "{key} not free after the settle time: holder token {token:?}, waiters {waiters:?}"
                ),
            ),
            What::Stuck => self.violation(Check::Stuck, format!("tasks still running at {at:?}")),
            _ => {}
        }
    }

    fn ownership_of_life(&self, life: &Life) -> &Ownership {
        &self.ownerships[life.ownership]
    }

    fn granted(
        &mut self,
        at: Duration,
        task: usize,
        guard: usize,
        key: Key,
        token: FencingToken,
        valid_until: Duration,
    ) {
        let Some(ask) = self.asks.get(&(task, guard)).copied() else {
            return;
        };
        // An idempotent run's grant is recorded when its work starts, after its reads.
        if ask.via != Via::Idempotent {
            if let Some(detail) = late(ask, at) {
                self.violation(Check::Wait, format!("t{task} granted {key} {detail}"));
            }
        }
        let owner = match ask.via {
            Via::Owner(owner) => Some(owner),
            _ => None,
        };
        // The owner's ownership of the key that it still holds: a grant to the owner now
        // is a re-entry of it, with its token.
        if let Some(owner) = owner {
            let live = self.ownerships.iter().rev().find(|ownership| {
                ownership.owner == Some(owner)
                    && ownership.key == key
                    && self.ended_at(ownership).is_none()
                    && at < self.valid_until(ownership)
                    && self.lost_at(ownership).is_none_or(|lost| lost > at)
                    && !self.revoked_by(ownership, at)
            });
            if let Some(live) = live.filter(|live| live.token != token) {
                let detail = format!(
                    "owner {owner} re-entered {key} at {at:?} (t{task}) under token {token}, while it held token {}",
                    live.token
                );
                self.violation(Check::Reentry, detail);
            }
        }
        let joined = owner.and_then(|owner| {
            self.ownerships.iter().rposition(|ownership| {
                ownership.owner == Some(owner)
                    && ownership.key == key
                    && ownership.token == token
                    && self.ended_at(ownership).is_none()
            })
        });
        let index = self.lives.len();
        let ownership = match joined {
            Some(ownership) => {
                self.ownerships[ownership].lives.push(index);
                ownership
            }
            None => {
                self.ownerships.push(Ownership {
                    key,
                    token,
                    owner,
                    lives: vec![index],
                    revoked_at: self.revoked.get(&(key, token)).copied(),
                });
                self.ownerships.len() - 1
            }
        };
        self.lives.push(Life {
            task,
            guard,
            via: ask.via,
            token,
            granted_at: at,
            valid_until,
            ended_at: None,
            lost_at: None,
            released: None,
            release_failed: false,
            dropped: false,
            cancelled: false,
            stopped: false,
            failed: false,
            finished: false,
            ownership,
        });
        self.by_guard.insert((task, guard), index);
    }

    /// A release (a once ticket's finish, a `with_lock` call, an idempotent call's `Lost`)
    /// returned `result` at `at`.
    fn released(&mut self, at: Duration, task: usize, guard: usize, result: Result<(), ErrorKind>) {
        let Some(index) = self.life(task, guard) else {
            return;
        };
        self.lives[index].released = Some((at, result));
        let ownership = self.ownership_of(index);
        let (valid_until, lost_at) = (self.valid_until(ownership), self.lost_at(ownership));
        let revoked = self.revoked_by(ownership, at);
        let (token, ended_at) = (self.lives[index].token, self.lives[index].ended_at);
        match result {
            Err(ErrorKind::Unavailable) => self.lives[index].release_failed = true,
            // The store ending the session frees the key at once: the holder may learn it
            // only from the release.
            Err(ErrorKind::Lost) if at < valid_until && !revoked => self.violation(
                Check::ReleaseVerdict,
                format!(
                    "t{task} token {token}: release said Lost at {at:?}, deadline {valid_until:?}"
                ),
            ),
            Ok(()) => {
                if let (Some(lost), Some(ended)) = (lost_at, ended_at) {
                    if lost < ended {
                        self.violation(
                            Check::ReleaseVerdict,
                            format!(
                                "t{task} token {token}: release begun at {ended:?} said Ok, lost() resolved at {lost:?}"
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether an acquisition asked as `ask` may end without a guard with `kind`.
    fn may_refuse(&self, ask: Ask, kind: ErrorKind) -> bool {
        match (ask.via, ask.how) {
            // A held key is `Ok(None)`, not an error (memory-session keeps a once hold
            // outside its sessions, as every store that answers once does).
            (Via::Once { .. }, _) => kind == ErrorKind::Unavailable,
            (_, How::Try) => matches!(kind, ErrorKind::HeldByAnother | ErrorKind::Unavailable),
            (_, How::UpTo(_)) => matches!(
                kind,
                ErrorKind::HeldByAnother | ErrorKind::TimedOut | ErrorKind::Unavailable
            ),
            (_, How::Forever) => false,
        }
    }

    fn finish(&mut self) {
        self.check_ownerships();
        self.check_once();
        self.check_idempotent();
    }

    /// The checks between the ownerships of one key, and each holder's loss signal.
    fn check_ownerships(&mut self) {
        let mut found = Vec::new();
        let mut violation = |check, detail: String| found.push(Violation { check, detail });
        for (i, earlier) in self.ownerships.iter().enumerate() {
            let valid_until = self.valid_until(earlier);
            let holds_until = self.holds_until(earlier);
            let lives = || earlier.lives.iter().map(|life| &self.lives[*life]);
            for life in lives().filter(|life| life.watched()) {
                let ran_out = life.ended_at.is_none_or(|end| end > valid_until + LATENESS);
                if ran_out
                    && life
                        .lost_at
                        .is_none_or(|lost| lost > valid_until + LATENESS)
                {
                    violation(
                        Check::LostLate,
                        format!(
                            "t{} token {}: deadline {valid_until:?} passed while held (ended {:?}), lost() at {:?}",
                            life.task, life.token, life.ended_at, life.lost_at
                        ),
                    );
                }
            }
            // The last guard's release gave the key back; a loss signalled well after it
            // succeeded is a loss of a lease that was released.
            if let Some(ended) = self.ended_at(earlier) {
                let last = lives().rfind(|life| life.ended_at == Some(ended));
                if let Some((released, Ok(()))) = last.and_then(|life| life.released) {
                    for life in lives() {
                        if let Some(lost) = life.lost_at.filter(|lost| *lost > released + LATENESS)
                        {
                            violation(
                                Check::LostAfterRelease,
                                format!(
                                    "t{} token {}: released at {released:?}, lost() at {lost:?}",
                                    life.task, life.token
                                ),
                            );
                        }
                    }
                }
            }
            for later in self.ownerships[i + 1..]
                .iter()
                .filter(|later| later.key == earlier.key)
            {
                let granted_at = self.lives[later.lives[0]].granted_at;
                // A hold not valid when first seen claims nothing: an idempotent run whose
                // work started after its lock was lost (allowed: the work is not stopped),
                // or a grant whose reply arrived after the store ended its session (its
                // holder learns of it at its next keep-alive, as documented).
                let claims = granted_at < self.valid_until(later)
                    && !self.revoked_by(later, granted_at)
                    && self.lost_at(later).is_none_or(|lost| lost > granted_at);
                if !claims {
                    continue;
                }
                if granted_at < holds_until {
                    violation(
                        Check::Overlap,
                        format!(
                            "{}: token {} granted at {granted_at:?} while token {} (first t{}) held it until {holds_until:?}",
                            later.key, later.token, earlier.token, self.lives[earlier.lives[0]].task
                        ),
                    );
                }
                // Idempotent runs are seen at their work's start, not in grant order.
                let observed = |o: &Ownership| self.lives[o.lives[0]].via != Via::Idempotent;
                if observed(earlier) && observed(later) && later.token <= earlier.token {
                    violation(
                        Check::TokenOrder,
                        format!(
                            "{}: token {} granted after token {}",
                            later.key, later.token, earlier.token
                        ),
                    );
                }
                // A holder whose session the store ended may hear of it after the rival's
                // grant, as documented; its deadline still bounds it (above).
                if self.revoked_by(earlier, granted_at) {
                    continue;
                }
                for life in lives().filter(|life| life.watched() && life.granted_at <= granted_at) {
                    let still_held = life.ended_at.is_none_or(|end| end > granted_at);
                    if still_held && life.lost_at.is_none_or(|lost| lost > granted_at + LATENESS) {
                        violation(
                            Check::LostLate,
                            format!(
                                "{}: token {} granted at {granted_at:?}; t{} token {} still held its guard, lost() at {:?}",
                                later.key, later.token, life.task, life.token, life.lost_at
                            ),
                        );
                    }
                }
            }
        }
        self.found.extend(found);
    }

    /// Once per window: no ticket of a key within an earlier ticket's window, and "taken"
    /// only while some window may be open.
    fn check_once(&mut self) {
        let mut found = Vec::new();
        let tickets: Vec<(&Life, Ask)> = self
            .lives
            .iter()
            .filter_map(|life| Some((life, *self.asks.get(&(life.task, life.guard))?)))
            .filter(|(_, ask)| matches!(ask.via, Via::Once { .. }))
            .collect();
        for (j, (second, second_ask)) in tickets.iter().enumerate() {
            for (first, first_ask) in tickets[..j].iter().filter(|(_, a)| a.key == second_ask.key) {
                let Via::Once { at_least, at_most } = first_ask.via else {
                    continue;
                };
                // The hold began in the store no earlier than the request was asked for,
                // and lasts `at_least` at the very least; `at_most` if the ticket was
                // dropped; finished, `at_least` from when the grant reached the caller.
                let mut window = first_ask.at + at_least;
                if first.dropped {
                    window = window.max(first_ask.at + at_most);
                }
                if at_least < at_most && matches!(first.released, Some((_, Ok(())))) {
                    window = window.max(first.granted_at + at_least);
                }
                if second.granted_at < window {
                    found.push(Violation {
                        check: Check::Once,
                        detail: format!(
                            "{}: t{} got a ticket at {:?}, within the window of t{}'s ticket (asked at {:?}, granted at {:?}, at_least {at_least:?}, at_most {at_most:?}, finish {:?}) which lasts until {window:?}",
                            second_ask.key, second.task, second.granted_at, first.task, first_ask.at, first.granted_at, first.released
                        ),
                    });
                }
            }
        }
        // "Taken" needs a hold: some other request on the key, whose hold (a ticket's, or
        // a failed attempt's the store may have applied) cannot have ended before this
        // request was asked (the store judged it at some moment between the ask and the
        // answer, which a slow reply may bring much later).
        for (task, guard, at) in &self.once_taken {
            let Some(ask) = self.asks.get(&(*task, *guard)) else {
                continue;
            };
            let open = self.asks.iter().any(|(call, other)| {
                let Via::Once { at_most, .. } = other.via else {
                    return false;
                };
                let ended = self.closed.get(call).copied().or_else(|| {
                    self.life(call.0, call.1)
                        .map(|life| self.lives[life].granted_at)
                });
                *call != (*task, *guard)
                    && other.key == ask.key
                    && other.at <= *at
                    && ended.is_none_or(|ended| ask.at <= ended + at_most + LATENESS)
            });
            if !open {
                found.push(Violation {
                    check: Check::Once,
                    detail: format!(
                        "t{task} once {} answered taken at {at:?}, no window open",
                        ask.key
                    ),
                });
            }
        }
        self.found.extend(found);
    }

    /// Idempotent execution: one recorded result per key, given to every later caller,
    /// and no run of the work once it is recorded.
    fn check_idempotent(&mut self) {
        let mut found = Vec::new();
        let mut violation = |detail: String| {
            found.push(Violation {
                check: Check::Idempotent,
                detail,
            })
        };
        let mut calls: Vec<(&(usize, usize), &Ask)> = self
            .asks
            .iter()
            .filter(|(_, ask)| ask.via == Via::Idempotent)
            .collect();
        calls.sort_by_key(|(call, ask)| (ask.at, **call));
        let succeeded = |id: &str| {
            calls.iter().any(|((task, guard), _)| {
                format!("t{task}.{guard}") == id
                    && self
                        .life(*task, *guard)
                        .is_some_and(|life| self.lives[life].finished && !self.lives[life].failed)
            })
        };
        let mut keys: Vec<Key> = calls.iter().map(|(_, ask)| ask.key).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let on_key = calls.iter().filter(|(_, ask)| ask.key == key);
            // The first result given to a caller: the record exists from then on.
            let mut recorded: Option<(Duration, String)> = None;
            for ((task, guard), _) in on_key.clone() {
                if let Some((at, Outcome::Ran(value) | Outcome::Replayed(value))) =
                    self.executed.get(&(*task, *guard))
                {
                    match &recorded {
                        Some((_, first)) if first != value => violation(format!(
                            "{key}: t{task} was given {value:?}, another caller {first:?}"
                        )),
                        Some((first_at, _)) if first_at <= at => {}
                        _ => recorded = Some((*at, value.clone())),
                    }
                }
            }
            for ((task, guard), ask) in on_key {
                let own = format!("t{task}.{guard}");
                let work = self.life(*task, *guard).map(|life| &self.lives[life]);
                let answer = self.executed.get(&(*task, *guard));
                match answer.map(|(_, outcome)| outcome) {
                    Some(Outcome::Ran(value)) => {
                        if *value != own || !work.is_some_and(|w| w.finished && !w.failed) {
                            violation(format!(
                                "{key}: t{task} answered Ran({value:?}) but its own work was {own:?}: {work:?}"
                            ));
                        }
                        // The record is written while the lease holds, after the work.
                        if let Some(work) = work {
                            let ownership = self.ownership_of_life(work);
                            let end = work.ended_at.unwrap_or_default();
                            if end >= work.valid_until || self.revoked_by(ownership, end) {
                                violation(format!(
                                    "{key}: t{task} answered Ran although its lock ran out (deadline {:?}, revoked {:?}) before its work ended at {end:?}",
                                    work.valid_until, ownership.revoked_at
                                ));
                            }
                        }
                    }
                    Some(Outcome::Replayed(value)) if work.is_some() || !succeeded(value) => {
                        violation(format!(
                            "{key}: t{task} answered Replayed({value:?}), which no successful run produced, or ran the work itself"
                        ));
                    }
                    Some(Outcome::Failed) if !work.is_some_and(|w| w.finished && w.failed) => {
                        violation(format!(
                            "{key}: t{task} answered Failed without a failed run"
                        ));
                    }
                    Some(Outcome::InProgress) => {
                        // One read, then one attempt (or a wait) for the lock.
                        let bound = REQUEST_TIMEOUT
                            + match ask.how {
                                How::UpTo(bound) => bound,
                                _ => REQUEST_TIMEOUT,
                            };
                        let at = answer.map(|(at, _)| *at).unwrap_or_default();
                        if at > ask.at + bound + WAIT_SLACK {
                            violation(format!(
                                "{key}: t{task} answered InProgress {:?} after asking ({:?})",
                                at - ask.at,
                                ask.how
                            ));
                        }
                    }
                    Some(Outcome::Error(kind))
                        if !matches!(kind, ErrorKind::Unavailable | ErrorKind::Lost) =>
                    {
                        violation(format!("{key}: t{task} ended {kind:?}"));
                    }
                    _ => {}
                }
                let Some((recorded_at, _)) = &recorded else {
                    continue;
                };
                // Asked after a result was given: the record is read first, and replayed.
                if ask.at > *recorded_at
                    && !matches!(
                        answer.map(|(_, outcome)| outcome),
                        None | Some(Outcome::Replayed(_) | Outcome::Error(ErrorKind::Unavailable))
                    )
                {
                    violation(format!(
                        "{key}: t{task} asked at {:?}, after a result was given at {recorded_at:?}, answered {:?}",
                        ask.at, answer
                    ));
                }
                // Work that starts under a live lock after the record was written: the
                // read under the lock would have found it.
                if let Some(work) = work {
                    let ownership = self.ownership_of_life(work);
                    let live = work.granted_at < work.valid_until
                        && !self.revoked_by(ownership, work.granted_at);
                    if live && work.granted_at > *recorded_at {
                        violation(format!(
                            "{key}: t{task}'s work started at {:?} under a live lock, after a result was given at {recorded_at:?}",
                            work.granted_at
                        ));
                    }
                }
            }
        }
        self.found.extend(found);
    }
}

/// How much an acquisition asked as `ask` and ended at `ended` overran its bound, if it
/// did.
fn late(ask: Ask, ended: Duration) -> Option<String> {
    let bound = match ask.how {
        // A wait of zero is one try.
        How::Try | How::UpTo(Duration::ZERO) => REQUEST_TIMEOUT,
        How::UpTo(bound) => bound,
        How::Forever => return None,
    };
    let took = ended.saturating_sub(ask.at);
    (took > bound + WAIT_SLACK).then(|| format!("after {took:?}, {:?} (bound {bound:?})", ask.how))
}
