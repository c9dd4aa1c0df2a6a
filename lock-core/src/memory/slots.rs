//! A key's slot in the memory store: its holders and waiters, and the rules that admit a
//! new holder. One set of rules for every primitive: a mutex is the case of one exclusive
//! holder, a semaphore admits up to its limit, a reader-writer lock many readers or one
//! writer.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::backend::{HolderInfo, ReleaseFeed};
use crate::values::error::{Error, Result};
use crate::values::key::{HoldKind, LockKey};
use crate::values::lease::{FencingToken, LeaseId};

/// Where `key`'s entries live: one slot per name and primitive, whatever mode (or, for a
/// semaphore, limit) the key asks for, so that the holders of a primitive meet.
pub(super) fn slot_key(key: &LockKey) -> LockKey {
    let canonical = match key.kind() {
        HoldKind::Mutex => return key.clone(),
        HoldKind::Permit { .. } => HoldKind::Permit { limit: 1 },
        HoldKind::Read | HoldKind::Write => HoldKind::Read,
    };
    // Never refused: only a limit of zero is.
    key.held_as(canonical).unwrap_or_else(|_| key.clone())
}

/// The store's clock and sessions: whether an entry (a lease or a waiter) still lives,
/// by its session where it has one, by its own expiry otherwise.
#[derive(Clone, Copy)]
pub(super) struct Alive<'a> {
    pub(super) sessions: &'a HashMap<u64, Instant>,
    pub(super) now: Instant,
}

impl Alive<'_> {
    pub(super) fn lives(&self, session: Option<u64>, expires_at: Instant) -> bool {
        match session {
            Some(session) => self.session_lives(session),
            None => self.now < expires_at,
        }
    }

    pub(super) fn session_lives(&self, session: u64) -> bool {
        self.sessions
            .get(&session)
            .is_some_and(|end| self.now < *end)
    }

    /// When the store ends an entry unless renewed: its session's end, or its own.
    pub(super) fn end(&self, session: Option<u64>, expires_at: Instant) -> Instant {
        match session {
            Some(session) => self.sessions.get(&session).copied().unwrap_or(self.now),
            None => expires_at,
        }
    }
}

/// One key's entries within its primitive.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// Its leases, oldest grant first; expired ones stay until a sweep or an attempt on
    /// the key drops them.
    pub(super) holders: Vec<Entry>,
    /// On a fair store, the queue in arrival order. On the others, the intents of writers
    /// that wait for a reader-writer lock.
    pub(super) waiters: VecDeque<Waiter>,
}

/// One lease holding a key.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) lease_id: LeaseId,
    pub(super) kind: HoldKind,
    pub(super) token: FencingToken,
    pub(super) expires_at: Instant,
    pub(super) session: Option<u64>,
    pub(super) holder: Option<Arc<str>>,
}

/// One lease waiting for a key: in a fair store's queue, or a waiting writer's intent.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) lease_id: LeaseId,
    pub(super) kind: HoldKind,
    pub(super) expires_at: Instant,
    /// In session mode, the session an automatically renewed waiter's entry lives by, as
    /// on etcd and ZooKeeper: its own polls do not keep it, the session's keep-alives do.
    pub(super) session: Option<u64>,
    /// A fair waiter's wake-ups ([`TurnWatch`](super::TurnWatch)).
    pub(super) wake: Arc<Notify>,
}

impl Entry {
    pub(super) fn lives(&self, alive: Alive<'_>) -> bool {
        alive.lives(self.session, self.expires_at)
    }

    pub(super) fn info(&self, alive: Alive<'_>, waiters: Option<usize>) -> HolderInfo {
        HolderInfo {
            lease_id: self.lease_id,
            token: self.token,
            remaining_ttl: alive
                .end(self.session, self.expires_at)
                .saturating_duration_since(alive.now),
            waiters,
            holder: self.holder.as_deref().map(String::from),
            kind: self.kind,
        }
    }
}

impl Waiter {
    pub(super) fn new(
        lease_id: LeaseId,
        kind: HoldKind,
        expires_at: Instant,
        session: Option<u64>,
    ) -> Self {
        Waiter {
            lease_id,
            kind,
            expires_at,
            session,
            wake: Arc::new(Notify::new()),
        }
    }

    pub(super) fn lives(&self, alive: Alive<'_>) -> bool {
        alive.lives(self.session, self.expires_at)
    }
}

/// Who holds a key, as far as admitting another holder goes.
#[derive(Clone, Copy, Default)]
struct Held {
    leases: usize,
    by_writer: bool,
}

/// Who waits ahead of a request: everyone queued before it on a fair store, the other
/// writers' intents on the others.
#[derive(Clone, Copy, Default)]
struct Ahead {
    waiters: usize,
    writer: bool,
}

impl Ahead {
    fn and(self, waiter: &Waiter) -> Self {
        Ahead {
            waiters: self.waiters + 1,
            writer: self.writer || waiter.kind == HoldKind::Write,
        }
    }
}

/// The grant rules ([`LockBackend`](crate::backend::LockBackend)'s *Shared holds*): an
/// exclusive hold when nobody holds the key (nor, on a fair store, waits ahead); a permit
/// while fewer than its limit hold or wait ahead; a read while no writer holds or waits
/// ahead.
fn admits(kind: HoldKind, held: Held, ahead: Ahead, fair: bool) -> bool {
    match kind {
        HoldKind::Mutex | HoldKind::Write => held.leases == 0 && (!fair || ahead.waiters == 0),
        HoldKind::Permit { limit } => held.leases + ahead.waiters < limit as usize,
        HoldKind::Read => !held.by_writer && !ahead.writer,
    }
}

impl Slot {
    pub(super) fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    /// Drops the expired holders and waiters; `true` when any went (waiters may be
    /// admitted now).
    pub(super) fn prune(&mut self, alive: Alive<'_>) -> bool {
        let before = (self.holders.len(), self.waiters.len());
        self.holders.retain(|entry| entry.lives(alive));
        self.waiters.retain(|waiter| waiter.lives(alive));
        before != (self.holders.len(), self.waiters.len())
    }

    /// The live holder `lease_id`'s entry.
    pub(super) fn holder_mut(&mut self, lease_id: LeaseId, alive: Alive<'_>) -> Option<&mut Entry> {
        self.holders
            .iter_mut()
            .find(|entry| entry.lease_id == lease_id && entry.lives(alive))
    }

    fn held(&self, alive: Alive<'_>) -> Held {
        self.holders.iter().filter(|entry| entry.lives(alive)).fold(
            Held::default(),
            |held, entry| Held {
                leases: held.leases + 1,
                by_writer: held.by_writer || entry.kind == HoldKind::Write,
            },
        )
    }

    /// Refuses a permit whose limit is not the one the semaphore's live holders and
    /// waiters asked with.
    pub(super) fn check_limit(&self, key: &LockKey, alive: Alive<'_>) -> Result<()> {
        let HoldKind::Permit { limit } = key.kind() else {
            return Ok(());
        };
        let kinds = self
            .holders
            .iter()
            .filter(|entry| entry.lives(alive))
            .map(|entry| entry.kind)
            .chain(
                self.waiters
                    .iter()
                    .filter(|waiter| waiter.lives(alive))
                    .map(|waiter| waiter.kind),
            );
        for kind in kinds {
            if let HoldKind::Permit { limit: theirs } = kind {
                if theirs != limit {
                    return Err(Error::invalid(format!(
                        "semaphore {:?} has {theirs} permits; asked with {limit}",
                        key.as_str()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether a new hold of `kind` by `lease_id` is admitted now: queued (a fair waiter,
    /// which must still be in the queue), or not (a fair store's try, which has the whole
    /// queue ahead of it; on other stores, the other writers' intents are ahead).
    pub(super) fn admits(
        &self,
        kind: HoldKind,
        lease_id: LeaseId,
        alive: Alive<'_>,
        fair: bool,
        queued: bool,
    ) -> bool {
        let mut ahead = Ahead::default();
        let mut found = false;
        for waiter in &self.waiters {
            if waiter.lease_id == lease_id {
                found = true;
                if fair {
                    break;
                }
            } else if waiter.lives(alive) {
                ahead = ahead.and(waiter);
            }
        }
        (found || !queued) && admits(kind, self.held(alive), ahead, fair)
    }

    /// Wakes every fair waiter the rules would admit now: the head for an exclusive hold,
    /// the readers up to the first writer, as many permits as there is room for.
    pub(super) fn wake_turns(&self, alive: Alive<'_>) {
        let held = self.held(alive);
        let mut ahead = Ahead::default();
        for waiter in self.waiters.iter().filter(|waiter| waiter.lives(alive)) {
            if admits(waiter.kind, held, ahead, true) {
                waiter.wake.notify_one();
            }
            ahead = ahead.and(waiter);
        }
    }

    /// Removes `lease_id`'s waiter entry, if it has one; `true` when it had.
    pub(super) fn remove_waiter(&mut self, lease_id: LeaseId) -> bool {
        let waiting = self.waiters.len();
        self.waiters.retain(|waiter| waiter.lease_id != lease_id);
        self.waiters.len() != waiting
    }
}

/// What a non-fair store's waiters of a key are told through the release feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum News {
    /// A holder of this kind left (or a writer's intent went, as `Write`): whoever it may
    /// have let in.
    Freed(HoldKind),
    /// A shared hold of this kind was granted with room for another: the next waiter of
    /// the same kind, so that a release lets in every waiter it can, one after another.
    RoomLeft(HoldKind),
}

/// The name a key's waiters of `kind` watch on the release feed: the key itself for the
/// mutex (as ever), a name of each other primitive's own for the rest, so that the three
/// namespaces never wake one another. Keys have no control characters, so no key's name
/// is another's.
pub(super) fn feed_name(key: &LockKey, kind: HoldKind) -> String {
    match kind {
        HoldKind::Mutex => key.as_str().to_string(),
        _ => format!("\u{1}{}\u{1}{}", kind.name(), key.as_str()),
    }
}

/// Tells the waiters of `key` that `news` may let them in: one waiter per name, as the
/// feed does ([`ReleaseFeed::released`]).
pub(super) fn announce(feed: &ReleaseFeed, key: &LockKey, news: News) {
    let wake: &[HoldKind] = match news {
        News::Freed(HoldKind::Mutex) | News::RoomLeft(HoldKind::Mutex) => &[HoldKind::Mutex],
        News::Freed(HoldKind::Permit { .. }) | News::RoomLeft(HoldKind::Permit { .. }) => {
            &[HoldKind::Permit { limit: 1 }]
        }
        // A reader leaving may let a writer in; a writer leaving (or giving up), readers
        // or the next writer.
        News::Freed(HoldKind::Read) => &[HoldKind::Write],
        News::Freed(HoldKind::Write) => &[HoldKind::Write, HoldKind::Read],
        News::RoomLeft(HoldKind::Read | HoldKind::Write) => &[HoldKind::Read],
    };
    for kind in wake {
        feed.released(&feed_name(key, *kind));
    }
}
