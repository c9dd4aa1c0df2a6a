//! In-process coalescing: the tasks of one client that want the same key line up here,
//! in arrival order, and only the one at the head talks to the store.
//!
//! Without it, 100 tasks of one process waiting for a key are 100 remote waiters: 100
//! pollers or queue entries, and a herd of attempts at every release, all for a key the
//! process can only hold once at a time anyway. With it they cost the store what one
//! waiting task costs, and they get the key in FIFO order among themselves.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use std::sync::Mutex;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::{held_by_another, lock_unpoisoned, DynBackend};
use crate::engine::cleanup::{Cleanup, CleanupOf};
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::{HoldKind, LockKey};
use crate::values::lease::Lease;
use crate::values::options::Wait;

type Lines = Arc<Mutex<HashMap<LockKey, Arc<Line>>>>;

/// The local line of each key some task of the client holds or waits for.
#[derive(Debug, Default)]
pub(crate) struct LocalLines {
    lines: Lines,
}

/// One key's line: its turns (one for an exclusive hold), handed out first come, first
/// served (tokio's semaphore is fair), how many tasks wait for one, and a lease handed from the last holder to the
/// next task (opt-in handoff).
#[derive(Debug)]
struct Line {
    turn: Arc<Semaphore>,
    waiting: Mutex<usize>,
    handed: Mutex<Option<Handoff>>,
}

/// A lease still held in the store, passed from a releasing task to the next one in line.
#[derive(Debug)]
pub(crate) struct Handoff {
    pub(crate) lease: Lease,
    pub(crate) backend: DynBackend,
    pub(crate) request_timeout: Duration,
}

impl Handoff {
    /// Gives the lease back to the store in the background (nobody took it over).
    pub(crate) fn release(self) {
        CleanupOf {
            what: Cleanup::Release,
            key: self.lease.key().clone(),
            lease_id: self.lease.id(),
            timeout: self.request_timeout,
            ttl: self.lease.ttl(),
        }
        .spawn(&self.backend, &[Duration::ZERO]);
    }
}

impl LocalLines {
    /// Waits for this task's turn at `key` within `wait`, measured from `started`.
    ///
    /// `Wait::No` takes the turn only if nobody of this client holds or waits for the key:
    /// it neither waits nor jumps the local line.
    pub(crate) async fn enter(
        &self,
        key: &LockKey,
        wait: Wait,
        started: Instant,
    ) -> Result<LocalTurn> {
        let line = Arc::clone(
            lock_unpoisoned(&self.lines)
                .entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(Line {
                        turn: Arc::new(Semaphore::new(turns(key))),
                        waiting: Mutex::new(0),
                        handed: Mutex::new(None),
                    })
                }),
        );
        let mut turn = LocalTurn {
            lines: Arc::clone(&self.lines),
            key: key.clone(),
            line,
            permit: None,
            handed: None,
        };
        let semaphore = Arc::clone(&turn.line.turn);
        let permit = match wait {
            Wait::No => semaphore
                .try_acquire_owned()
                .map_err(|_| held_by_another(key))?,
            Wait::Forever | Wait::UpTo(_) => {
                let acquire = semaphore.acquire_owned();
                tokio::pin!(acquire);
                // Counted only once the semaphore has it in line: a task seen waiting
                // (`local_waiters`) is then served before any task that comes after it.
                // Counted first, a task preempted between the two steps was overtaken
                // by one that arrived after it had been seen waiting.
                let first = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
                let (_waiting, acquired) = match first {
                    Poll::Ready(acquired) => (None, acquired),
                    Poll::Pending => {
                        let waiting = Waiting::count(&turn.line);
                        let acquired = match wait.deadline_from(started) {
                            Some(until) => tokio::time::timeout_at(until.into(), acquire)
                                .await
                                .map_err(|_| {
                                    Error::new(
                                        ErrorKind::TimedOut,
                                        format!(
                                            "{:?} stayed held by this client's other tasks for the whole wait",
                                            key.as_str()
                                        ),
                                    )
                                })?,
                            None => acquire.await,
                        };
                        (Some(waiting), acquired)
                    }
                };
                acquired.map_err(closed)?
            }
        };
        turn.permit = Some(permit);
        // Taken with the turn, with no await in between: a lease handed to this turn is
        // never left in the line by a cancellation.
        turn.handed = lock_unpoisoned(&turn.line.handed).take();
        Ok(turn)
    }

    /// How many of this client's tasks wait in line for `key` (not counting the one whose
    /// turn it is).
    pub(crate) fn waiting(&self, key: &LockKey) -> usize {
        lock_unpoisoned(&self.lines)
            .get(key)
            .map_or(0, |line| *lock_unpoisoned(&line.waiting))
    }
}

/// How many of the client's tasks may hold `key` at once, and so go to the store without
/// waiting in line: one for an exclusive hold; for a semaphore, no more tasks than it has
/// permits (the store would refuse the others anyway); readers do not line up.
fn turns(key: &LockKey) -> usize {
    match key.kind() {
        HoldKind::Mutex | HoldKind::Write => 1,
        HoldKind::Permit { limit } => (limit as usize).min(Semaphore::MAX_PERMITS),
        HoldKind::Read => Semaphore::MAX_PERMITS,
    }
}

/// Never happens: the lines' semaphores are never closed.
fn closed(_: tokio::sync::AcquireError) -> Error {
    Error::new(ErrorKind::Internal, "a local lock line was closed")
}

/// Counts a task as waiting while it waits, also when it is cancelled.
struct Waiting<'a>(&'a Line);

impl<'a> Waiting<'a> {
    fn count(line: &'a Line) -> Self {
        *lock_unpoisoned(&line.waiting) += 1;
        Waiting(line)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        *lock_unpoisoned(&self.0.waiting) -= 1;
    }
}

/// A task's turn at a key; ending it (a release, a failed acquisition, a cancelled wait)
/// lets the next task of the line go to the store, and forgets the line when nobody else
/// is in it.
#[derive(Debug)]
pub(crate) struct LocalTurn {
    lines: Lines,
    key: LockKey,
    line: Arc<Line>,
    permit: Option<OwnedSemaphorePermit>,
    handed: Option<Handoff>,
}

impl LocalTurn {
    /// The lease the previous holder handed to this turn, if it did.
    pub(crate) fn take_handed(&mut self) -> Option<Handoff> {
        self.handed.take()
    }

    /// Ends the turn handing `handoff` to the next task in line; gives it back when no
    /// task waits.
    pub(crate) fn hand_off(self, handoff: Handoff) -> Option<Handoff> {
        if *lock_unpoisoned(&self.line.waiting) == 0 {
            return Some(handoff);
        }
        *lock_unpoisoned(&self.line.handed) = Some(handoff);
        None
    }
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        if let Some(unused) = self.handed.take() {
            unused.release();
        }
        drop(self.permit.take());
        let mut lines = lock_unpoisoned(&self.lines);
        // The map's reference and this one: no other task holds or waits for the key (a
        // task takes its reference under the map's lock, so none can appear meanwhile).
        if Arc::strong_count(&self.line) <= 2
            && lines
                .get(&self.key)
                .is_some_and(|current| Arc::ptr_eq(current, &self.line))
        {
            lines.remove(&self.key);
            // Handed over just as every waiter gave up: nobody will take it.
            if let Some(unused) = lock_unpoisoned(&self.line.handed).take() {
                unused.release();
            }
        }
    }
}
