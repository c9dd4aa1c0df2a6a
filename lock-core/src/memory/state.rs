//! The memory store's state and the atomic steps on it, each taken under the store's one
//! lock: grants (of a key, or of a lock set whole), releases, queue entries, sessions.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{AcquireRequest, HolderInfo, Ownership, Record};
use crate::values::error::{Error, Result};
use crate::values::key::{HoldKind, LockKey};
use crate::values::lease::{FencingToken, LeaseId};

use super::slots::{slot_key, Alive, Entry, News, Slot, Waiter};

#[derive(Debug, Default)]
pub(super) struct State {
    /// Whether waiters are granted keys in arrival order (through the queue operations).
    pub(super) fair: bool,
    /// Each key's holders and waiters, one slot per name and primitive ([`slot_key`]).
    pub(super) slots: HashMap<LockKey, Slot>,
    /// Live sessions and when the store ends each unless kept alive.
    pub(super) sessions: HashMap<u64, Instant>,
    pub(super) last_session: u64,
    pub(super) last_token: u64,
    pub(super) writes_since_sweep: usize,
    /// Idempotency records and when each is forgotten.
    pub(super) records: HashMap<LockKey, (Record, Instant)>,
}

/// How long a grant (or a writer's intent) of one attempt lives.
#[derive(Clone, Copy)]
pub(super) struct Stay {
    pub(super) expires_at: Instant,
    /// The session a grant lives by.
    pub(super) session: Option<u64>,
    /// The session a waiting writer's intent lives by.
    pub(super) waiting: Option<u64>,
}

impl State {
    pub(super) fn alive(&self, now: Instant) -> Alive<'_> {
        Alive {
            sessions: &self.sessions,
            now,
        }
    }

    /// The token of each request's grant if the rules admit every one of them now, and
    /// whether another request of its (shared) kind would be admitted after it; `None`,
    /// changing nothing, when any is refused (but the intent a single waiting writer
    /// leaves).
    pub(super) fn admit(
        &mut self,
        requests: &[AcquireRequest],
        stays: &[Stay],
        queued: bool,
        now: Instant,
    ) -> Result<Option<Vec<(FencingToken, bool)>>> {
        let fair = self.fair;
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let keys: Vec<LockKey> = requests.iter().map(|r| slot_key(r.key())).collect();
        let mut admitted = true;
        for (at, (request, key)) in requests.iter().zip(&keys).enumerate() {
            if keys[..at].contains(key) {
                return Err(Error::invalid(format!(
                    "a set names {:?} twice",
                    request.key()
                )));
            }
            let slot = self.slots.entry(key.clone()).or_default();
            if slot.prune(alive) && fair {
                slot.wake_turns(alive);
            }
            let checked = slot.check_limit(request.key(), alive);
            let lease_id = request.lease_id();
            admitted = admitted
                && checked.is_ok()
                && (slot.holder_mut(lease_id, alive).is_some()
                    || slot.admits(request.key().kind(), lease_id, alive, fair, queued));
            if slot.is_empty() {
                self.slots.remove(key);
            }
            checked?;
        }
        let granted = match (admitted, requests, stays) {
            (true, _, _) => {
                let mut granted = Vec::with_capacity(requests.len());
                for ((request, stay), key) in requests.iter().zip(stays).zip(&keys) {
                    let slot = self.slots.entry(key.clone()).or_default();
                    granted.push(Self::take(
                        &mut self.last_token,
                        slot,
                        request,
                        *stay,
                        alive,
                        fair,
                    ));
                }
                Some(granted)
            }
            (false, [request], [stay]) => {
                if !fair && request.key().kind() == HoldKind::Write && request.waits() {
                    let slot = self.slots.entry(keys[0].clone()).or_default();
                    match slot
                        .waiters
                        .iter_mut()
                        .find(|w| w.lease_id == request.lease_id())
                    {
                        Some(intent) => {
                            intent.expires_at = stay.expires_at;
                            intent.session = stay.waiting;
                        }
                        None => slot.waiters.push_back(Waiter::new(
                            request.lease_id(),
                            HoldKind::Write,
                            stay.expires_at,
                            stay.waiting,
                        )),
                    }
                }
                None
            }
            (false, _, _) => None,
        };
        Ok(granted)
    }

    /// Gives `slot`'s key to `request`, which the rules admit: the same grant again to a
    /// retry of a holder (its TTL restarted), a new token otherwise; and whether another
    /// request of its shared kind would be admitted after it.
    fn take(
        last_token: &mut u64,
        slot: &mut Slot,
        request: &AcquireRequest,
        stay: Stay,
        alive: Alive<'_>,
        fair: bool,
    ) -> (FencingToken, bool) {
        let (kind, lease_id) = (request.key().kind(), request.lease_id());
        // Its queue entry or intent is over: the next waiter's turn comes with the
        // release.
        slot.remove_waiter(lease_id);
        if let Some(entry) = slot.holder_mut(lease_id, alive) {
            entry.expires_at = stay.expires_at;
            return (entry.token, false);
        }
        *last_token += 1;
        let token = FencingToken::new(*last_token);
        slot.holders.push(Entry {
            lease_id,
            kind,
            token,
            expires_at: stay.expires_at,
            session: stay.session,
            holder: request.holder_label().map(Arc::from),
        });
        let room_left = kind.is_shared() && slot.admits(kind, lease_id, alive, fair, false);
        (token, room_left)
    }

    /// Extends the live lease `lease_id` of `key` to `expires_at`, or keeps its session
    /// alive for `ttl`.
    pub(super) fn renew(
        &mut self,
        key: &LockKey,
        lease_id: LeaseId,
        expires_at: Instant,
        ttl: Duration,
        now: Instant,
    ) -> Ownership {
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let Some(entry) = self
            .slots
            .get_mut(&slot_key(key))
            .and_then(|slot| slot.holder_mut(lease_id, alive))
        else {
            return Ownership::NotHeld;
        };
        match entry.session {
            Some(session) => Ownership::held_if(self.keep_alive(session, ttl)),
            None => {
                entry.expires_at = expires_at;
                Ownership::Held
            }
        }
    }

    /// Whether the live lease `lease_id` holds `key`.
    pub(super) fn holds(&self, key: &LockKey, lease_id: LeaseId, now: Instant) -> bool {
        let alive = self.alive(now);
        self.slots.get(&slot_key(key)).is_some_and(|slot| {
            slot.holders
                .iter()
                .any(|entry| entry.lease_id == lease_id && entry.lives(alive))
        })
    }

    /// Removes the lease (or a waiting writer's intent) `lease_id` of `key`: what it held
    /// and whether it was live, `None` when the store had neither.
    pub(super) fn release(
        &mut self,
        key: &LockKey,
        lease_id: LeaseId,
        now: Instant,
    ) -> Option<(News, bool)> {
        let fair = self.fair;
        let key = slot_key(key);
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let slot = self.slots.get_mut(&key)?;
        let released = match slot.holders.iter().position(|e| e.lease_id == lease_id) {
            Some(at) => {
                let entry = slot.holders.remove(at);
                Some((News::Freed(entry.kind), entry.lives(alive)))
            }
            // Only the intent was there: gone, and the lease was never held.
            None if !fair && slot.remove_waiter(lease_id) => {
                Some((News::Freed(HoldKind::Write), false))
            }
            None => None,
        };
        if released.is_some() && fair {
            slot.wake_turns(alive);
        }
        if slot.is_empty() {
            self.slots.remove(&key);
        }
        released
    }

    /// Every live holder of `key`, oldest grant first; on a fair store, dead waiters are
    /// dropped on the way and the queue's length reported.
    pub(super) fn holders(&mut self, key: &LockKey, now: Instant) -> Vec<HolderInfo> {
        let fair = self.fair;
        let key = slot_key(key);
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let Some(slot) = self.slots.get_mut(&key) else {
            return Vec::new();
        };
        if fair && slot.prune(alive) {
            slot.wake_turns(alive);
        }
        let waiters = fair.then_some(slot.waiters.len());
        let holders = slot
            .holders
            .iter()
            .filter(|entry| entry.lives(alive))
            .map(|entry| entry.info(alive, waiters))
            .collect();
        if slot.is_empty() {
            self.slots.remove(&key);
        }
        holders
    }

    /// Keeps the queued `lease_id`'s entry alive until `expires_at`, dropping dead waiters
    /// on the way; `false` when it is not in the queue.
    pub(super) fn keep_queued(
        &mut self,
        key: &LockKey,
        lease_id: LeaseId,
        expires_at: Instant,
        now: Instant,
    ) -> bool {
        let key = slot_key(key);
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let Some(slot) = self.slots.get_mut(&key) else {
            return false;
        };
        if slot.prune(alive) {
            slot.wake_turns(alive);
        }
        let own = slot.waiters.iter_mut().find(|w| w.lease_id == lease_id);
        let queued = own.is_some();
        if let Some(waiter) = own {
            waiter.expires_at = expires_at;
        }
        if slot.is_empty() {
            self.slots.remove(&key);
        }
        queued
    }

    /// Puts `request` in its key's queue, or keeps its place there.
    pub(super) fn enqueue(
        &mut self,
        request: &AcquireRequest,
        expires_at: Instant,
        session: Option<u64>,
        now: Instant,
    ) -> Result<()> {
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let slot = self.slots.entry(slot_key(request.key())).or_default();
        slot.check_limit(request.key(), alive)?;
        match slot
            .waiters
            .iter_mut()
            .find(|w| w.lease_id == request.lease_id())
        {
            Some(waiter) => waiter.expires_at = expires_at,
            None => slot.waiters.push_back(Waiter::new(
                request.lease_id(),
                request.key().kind(),
                expires_at,
                session,
            )),
        }
        Ok(())
    }

    pub(super) fn leave_queue(&mut self, key: &LockKey, lease_id: LeaseId, now: Instant) {
        let key = slot_key(key);
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        if let Some(slot) = self.slots.get_mut(&key) {
            if slot.remove_waiter(lease_id) && self.fair {
                slot.wake_turns(alive);
            }
            if slot.is_empty() {
                self.slots.remove(&key);
            }
        }
    }

    /// Ends the session of `key`'s oldest live holder bound to one, freeing every hold of
    /// that session: the holds freed, `None` when no live session holds `key`.
    pub(super) fn end_session_holding(
        &mut self,
        key: &LockKey,
        now: Instant,
    ) -> Option<Vec<(LockKey, HoldKind)>> {
        let alive = self.alive(now);
        let session = self.slots.get(&slot_key(key)).and_then(|slot| {
            slot.holders
                .iter()
                .filter(|entry| entry.lives(alive))
                .find_map(|entry| entry.session)
        })?;
        self.sessions.remove(&session);
        let alive = Alive {
            sessions: &self.sessions,
            now,
        };
        let mut freed = Vec::new();
        for (key, slot) in &mut self.slots {
            freed.extend(
                slot.holders
                    .iter()
                    .filter(|entry| entry.session == Some(session))
                    .map(|entry| (key.clone(), entry.kind)),
            );
            // Its holds and waiters die with the session.
            if slot.prune(alive) && self.fair {
                slot.wake_turns(alive);
            }
        }
        self.slots.retain(|_, slot| !slot.is_empty());
        Some(freed)
    }

    /// Drops expired entries and sessions now and then, so crashed holders do not
    /// accumulate.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.writes_since_sweep += 1;
        if self.writes_since_sweep >= 1024.max(self.slots.len()) {
            self.writes_since_sweep = 0;
            self.sessions.retain(|_, end| now < *end);
            let alive = Alive {
                sessions: &self.sessions,
                now,
            };
            for slot in self.slots.values_mut() {
                if slot.prune(alive) && self.fair {
                    slot.wake_turns(alive);
                }
            }
            self.slots.retain(|_, slot| !slot.is_empty());
            self.records.retain(|_, (_, until)| now < *until);
        }
    }

    /// Opens a session the store ends `ttl` after its last keep-alive.
    pub(super) fn open_session(&mut self, ttl: Duration) -> u64 {
        self.last_session += 1;
        let id = self.last_session;
        self.sessions.insert(
            id,
            crate::values::options::saturating_add(crate::values::clock::now(), ttl),
        );
        id
    }

    /// Keeps a live session alive for `ttl` from now; `false` when it has ended.
    pub(super) fn keep_alive(&mut self, session: u64, ttl: Duration) -> bool {
        let now = crate::values::clock::now();
        match self.sessions.get_mut(&session) {
            Some(end) if now < *end => {
                *end = crate::values::options::saturating_add(now, ttl);
                true
            }
            _ => {
                self.sessions.remove(&session);
                false
            }
        }
    }
}
