//! The in-memory reference backend, and [`MemoryLink`] to cut its clients off in tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend::{
    lock_unpoisoned as lock, AcquireRequest, Capabilities, Change, Grant, HolderInfo, KeyWatch,
    Liveness, LockBackend, Ownership, Record, ReleaseFeed, Turn,
};
use crate::values::error::{Error, Result};
use crate::values::key::{HoldKind, LockKey, Primitive};
use crate::values::lease::{FencingToken, LeaseId};

mod sessions;
mod slots;

use sessions::ClientSessions;
pub use sessions::MemoryLink;
use slots::{announce, feed_name, slot_key, Alive, Entry, News, Slot, Waiter};

/// Locks kept in this process's memory: every capability, for tests, examples and for
/// coordinating tasks of one process.
///
/// Clones are the same client of the same store; [`client`](Self::client) makes another
/// client of the store, as another process would be. Tokens come from one counter for the
/// whole store, so they grow across every key, release and takeover and nothing per key
/// outlives a release. Expired leases are swept lazily.
///
/// - [`MemoryBackend::fair`]: waiters are granted the key in arrival order through the
///   core's queue interface; a waiter that gives up leaves the queue at once, one that
///   dies leaves it when its TTL runs out (in session mode: when its session ends, as on
///   etcd and ZooKeeper, so a waiter that gave up but could not leave stays in line for
///   as long as its client's session lives).
/// - [`with_sessions`](Self::with_sessions): leases live by store sessions
///   ([`Liveness::Session`]), one per distinct TTL per client (and one per lease renewed
///   by hand), kept alive by one keep-alive task each; [`link`](Self::link) can cut or slow
///   a client's connection to prove how the core follows sessions. A
///   [detached](crate::backend::AcquireRequest::detached) hold (a once ticket) belongs to
///   no session and lives by its TTL ([`Capabilities::detached_holds`]).
///
/// Semaphores and reader-writer locks ([`Capabilities::shared_holds`]) are kept like the
/// mutex, in every mode: each name has one slot per primitive, holding its leases (each
/// with its own kind, token, expiry or session and label, oldest grant first) and its
/// waiters. On a fair store the waiters are one queue of every kind, granted by rank: a
/// permit when fewer than its limit hold or queue ahead of it, a read when no writer holds
/// or queues ahead, a write (as a mutex) when first in line with nobody holding. Otherwise
/// they are the intents of writers that wait, which keep new readers out until the writer
/// has had its turn or gives up. Release notifications wake a semaphore's waiters, readers
/// and writers under names of their own; a release that lets several readers (or permits)
/// in wakes them one after another, each grant waking the next.
///
/// A store without a queue takes a lock set in one step under its one lock
/// ([`Capabilities::atomic_sets`]); a fair store takes it key by key, through its queues,
/// which a set waiting by attempts would overtake.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    store: Arc<Store>,
    capabilities: Capabilities,
    sessions: Option<Arc<ClientSessions>>,
}

#[derive(Debug)]
pub(crate) struct Store {
    state: Mutex<State>,
    releases: ReleaseFeed,
}

#[derive(Debug, Default)]
struct State {
    /// Whether waiters are granted keys in arrival order (through the queue operations).
    fair: bool,
    /// Each key's holders and waiters, one slot per name and primitive ([`slot_key`]).
    slots: HashMap<LockKey, Slot>,
    /// Live sessions and when the store ends each unless kept alive.
    sessions: HashMap<u64, Instant>,
    last_session: u64,
    last_token: u64,
    writes_since_sweep: usize,
    /// Idempotency records and when each is forgotten.
    records: HashMap<LockKey, (Record, Instant)>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryBackend {
    /// An empty store whose waiters poll, woken early by release notifications.
    pub fn new() -> Self {
        Self::with_fairness(false)
    }

    /// An empty store that grants each key to its waiters in arrival order.
    pub fn fair() -> Self {
        Self::with_fairness(true)
    }

    fn with_fairness(fair: bool) -> Self {
        MemoryBackend {
            store: Arc::new(Store {
                state: Mutex::new(State {
                    fair,
                    ..State::default()
                }),
                releases: ReleaseFeed::new(),
            }),
            capabilities: Capabilities {
                fair_ordering: fair,
                native_notification: true,
                durable_fencing: true,
                reentrancy: true,
                records: true,
                shared_holds: true,
                // A set waiting by attempts would overtake a fair store's queues.
                atomic_sets: !fair,
                ..Capabilities::default()
            },
            sessions: None,
        }
    }

    /// The same store, with leases kept alive by client sessions instead of per-key
    /// renewal ([`Liveness::Session`]).
    pub fn with_sessions(mut self) -> Self {
        self.capabilities.liveness = Liveness::Session;
        // A detached hold is an entry of no session, kept by its expiry like the
        // store's TTL leases.
        self.capabilities.detached_holds = true;
        self.sessions = Some(Arc::new(ClientSessions::new(&self.store)));
        self
    }

    /// Another client of the same store, with its own sessions and link.
    pub fn client(&self) -> Self {
        MemoryBackend {
            sessions: self
                .sessions
                .as_ref()
                .map(|_| Arc::new(ClientSessions::new(&self.store))),
            ..self.clone()
        }
    }

    /// The link between this client and the store, in session mode: cut it or slow its
    /// replies to see how leases follow their sessions.
    pub fn link(&self) -> Option<MemoryLink> {
        self.sessions.as_ref().map(|sessions| sessions.link())
    }

    /// In session mode, ends the session that keeps `key`'s holder (its oldest, for a
    /// shared hold), from the store's side and with the holder's link healthy, as a server
    /// ends a session it has given up on (etcd revoking its lease, ZooKeeper expiring it):
    /// every lock of that session is free at once, and its client learns of the end at its
    /// next keep-alive. `false` when no live session holds `key`.
    pub fn end_session_holding(&self, key: &LockKey) -> bool {
        let freed = lock(&self.store.state).end_session_holding(key, crate::values::clock::now());
        let Some(freed) = freed else {
            return false;
        };
        for (key, kind) in &freed {
            announce(&self.store.releases, key, News::Freed(*kind));
        }
        true
    }

    /// How many live waiters a fair store has in `key`'s queue now (none in a store that
    /// is not fair): what the core's clean-ups leave behind, seen directly.
    pub fn queued(&self, key: &LockKey) -> usize {
        let state = lock(&self.store.state);
        if !state.fair {
            return 0;
        }
        let alive = state.alive(crate::values::clock::now());
        state.slots.get(&slot_key(key)).map_or(0, |slot| {
            slot.waiters
                .iter()
                .filter(|waiter| waiter.lives(alive))
                .count()
        })
    }

    fn expiry(&self, ttl: Duration) -> Result<Instant> {
        crate::values::clock::now()
            .checked_add(ttl)
            .ok_or_else(|| Error::invalid(format!("TTL {ttl:?} is too large")))
    }

    /// Fails every request while the client's link is cut.
    fn reachable(&self) -> Result<()> {
        match &self.sessions {
            Some(sessions) => sessions.reachable(),
            None => Ok(()),
        }
    }

    /// The store's id of the session a waiter of `request` lives by: in session mode, an
    /// automatically renewed waiter's, as on etcd and ZooKeeper.
    async fn waiter_session(&self, request: &AcquireRequest) -> Result<Option<u64>> {
        Ok(match &self.sessions {
            Some(sessions) if request.renewal() == crate::Renewal::Auto => Some(
                sessions
                    .session_for(request, request.store_ttl())
                    .await?
                    .store_id,
            ),
            _ => None,
        })
    }

    /// The grants of `requests`, all or none, if the store gives them (one request but
    /// for a lock set); `queued` for a waiter of a fair queue, which must be ahead of
    /// whoever it may not overtake.
    async fn grant(&self, requests: &[AcquireRequest], queued: bool) -> Result<Option<Vec<Grant>>> {
        self.reachable()?;
        let mut sessions = Vec::with_capacity(requests.len());
        let mut stays = Vec::with_capacity(requests.len());
        for request in requests {
            let expires_at = self.expiry(request.store_ttl())?;
            let session = match &self.sessions {
                Some(sessions) if !request.is_detached() => {
                    Some(sessions.session_for(request, request.store_ttl()).await?)
                }
                _ => None,
            };
            stays.push(Stay {
                expires_at,
                session: session.as_ref().map(|s| s.store_id),
                // A writer's intent lives as a fair waiter's entry would.
                waiting: session
                    .as_ref()
                    .filter(|_| request.renewal() == crate::Renewal::Auto)
                    .map(|s| s.store_id),
            });
            sessions.push(session);
        }
        let admitted = {
            let mut state = lock(&self.store.state);
            let now = crate::values::clock::now();
            for session in sessions.iter().flatten() {
                if !state.alive(now).session_lives(session.store_id) {
                    // The client has not heard yet that the store ended the session: tell
                    // it, so the retry of this attempt opens a new one.
                    session.keeper.expired();
                    return Err(Error::unavailable(
                        "the session ended before the grant; retrying under a new session",
                    ));
                }
            }
            state.sweep(now);
            state.admit(requests, &stays, queued, now)?
        };
        let Some(admitted) = admitted else {
            return Ok(None);
        };
        let mut grants = Vec::with_capacity(requests.len());
        for ((request, (token, room_left)), session) in requests.iter().zip(admitted).zip(sessions)
        {
            if room_left {
                announce(
                    &self.store.releases,
                    request.key(),
                    News::RoomLeft(request.key().kind()),
                );
            }
            grants.push(match session {
                Some(session) => Grant::in_session(token, session.keeper.session()),
                None => Grant::new(token),
            });
        }
        Ok(Some(grants))
    }
}

#[cfg(test)]
mod tests;

/// How long a grant (or a writer's intent) of one attempt lives.
#[derive(Clone, Copy)]
struct Stay {
    expires_at: Instant,
    /// The session a grant lives by.
    session: Option<u64>,
    /// The session a waiting writer's intent lives by.
    waiting: Option<u64>,
}

impl State {
    fn alive(&self, now: Instant) -> Alive<'_> {
        Alive {
            sessions: &self.sessions,
            now,
        }
    }

    /// The token of each request's grant if the rules admit every one of them now, and
    /// whether another request of its (shared) kind would be admitted after it; `None`,
    /// changing nothing, when any is refused (but the intent a single waiting writer
    /// leaves).
    fn admit(
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

    /// Removes the lease (or a waiting writer's intent) `lease_id` of `key`: what it held
    /// and whether it was live, `None` when the store had neither.
    fn release(&mut self, key: &LockKey, lease_id: LeaseId, now: Instant) -> Option<(News, bool)> {
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
    fn holders(&mut self, key: &LockKey, now: Instant) -> Vec<HolderInfo> {
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
    fn keep_queued(
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
    fn enqueue(
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

    fn leave_queue(&mut self, key: &LockKey, lease_id: LeaseId, now: Instant) {
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
    fn end_session_holding(
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
            let before = freed.len();
            freed.extend(
                slot.holders
                    .iter()
                    .filter(|entry| entry.session == Some(session))
                    .map(|entry| (key.clone(), entry.kind)),
            );
            // Its holds and waiters die with the session.
            let waiter_left = slot.prune(alive);
            if self.fair && (waiter_left || freed.len() > before) {
                slot.wake_turns(alive);
            }
        }
        self.slots.retain(|_, slot| !slot.is_empty());
        Some(freed)
    }

    /// Drops expired entries and sessions now and then, so crashed holders do not
    /// accumulate.
    fn sweep(&mut self, now: Instant) {
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
    fn open_session(&mut self, ttl: Duration) -> u64 {
        self.last_session += 1;
        let id = self.last_session;
        self.sessions.insert(
            id,
            crate::values::options::saturating_add(crate::values::clock::now(), ttl),
        );
        id
    }

    /// Keeps a live session alive for `ttl` from now; `false` when it has ended.
    fn keep_alive(&mut self, session: u64, ttl: Duration) -> bool {
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

#[async_trait]
impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let granted = self.grant(std::slice::from_ref(request), false).await?;
        Ok(granted.and_then(|grants| grants.into_iter().next()))
    }

    /// Every key's slot is looked at under the store's one lock before any is taken.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<Option<Vec<Grant>>> {
        self.grant(requests, false).await
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.reachable()?;
        let expires_at = self.expiry(ttl)?;
        let now = crate::values::clock::now();
        let mut guard = lock(&self.store.state);
        let state = &mut *guard;
        let alive = Alive {
            sessions: &state.sessions,
            now,
        };
        let Some(entry) = state
            .slots
            .get_mut(&slot_key(key))
            .and_then(|slot| slot.holder_mut(lease_id, alive))
        else {
            return Ok(Ownership::NotHeld);
        };
        match entry.session {
            Some(session) => Ok(Ownership::held_if(state.keep_alive(session, ttl))),
            None => {
                entry.expires_at = expires_at;
                Ok(Ownership::Held)
            }
        }
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.reachable()?;
        let released = lock(&self.store.state).release(key, lease_id, crate::values::clock::now());
        let Some((news, live)) = released else {
            return Ok(Ownership::NotHeld);
        };
        announce(&self.store.releases, key, news);
        Ok(Ownership::held_if(live))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        Ok(self.holders(key).await?.into_iter().next())
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        self.reachable()?;
        Ok(lock(&self.store.state).holders(key, crate::values::clock::now()))
    }

    /// Held or expired leases, queued waiters and waiting writers' intents, whatever their
    /// state, of every primitive.
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.reachable()?;
        let state = lock(&self.store.state);
        let mut keys: Vec<String> = state
            .slots
            .keys()
            .map(LockKey::as_str)
            .filter(|key| key.starts_with(prefix))
            .map(String::from)
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Mutexes only: the core never asks it of the other primitives.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let mut keys: Vec<LockKey> = {
            self.reachable()?;
            let state = lock(&self.store.state);
            state
                .slots
                .keys()
                .filter(|key| key.primitive() == Primitive::Mutex)
                .filter(|key| key.as_str().starts_with(prefix))
                .cloned()
                .collect()
        };
        keys.sort();
        let mut held = Vec::new();
        for key in keys {
            if held.len() == limit {
                break;
            }
            // Through `inspect`, so expired entries are skipped and waiters counted alike.
            if let Some(info) = self.inspect(&key).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        self.reachable()?;
        Ok(Some(self.store.releases.watch(feed_name(key, key.kind()))))
    }

    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        self.reachable()?;
        if !self.capabilities.fair_ordering {
            return Err(crate::backend::no_queue(self.name()));
        }
        let expires_at = self.expiry(request.store_ttl())?;
        let session = self.waiter_session(request).await?;
        let mut state = lock(&self.store.state);
        let now = crate::values::clock::now();
        if let Some(session) = session {
            if !state.alive(now).session_lives(session) {
                return Err(Error::unavailable(
                    "the session ended before the enqueue; retrying under a new session",
                ));
            }
        }
        state.enqueue(request, expires_at, session, now)
    }

    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        self.reachable()?;
        if !self.capabilities.fair_ordering {
            return Err(crate::backend::no_queue(self.name()));
        }
        let expires_at = self.expiry(request.ttl())?;
        // A live waiter's poll keeps its entry alive.
        let queued = lock(&self.store.state).keep_queued(
            request.key(),
            request.lease_id(),
            expires_at,
            crate::values::clock::now(),
        );
        if !queued {
            return Ok(Turn::NotQueued);
        }
        let granted = self.grant(std::slice::from_ref(request), true).await?;
        Ok(match granted.and_then(|grants| grants.into_iter().next()) {
            Some(grant) => Turn::Granted(grant),
            None => Turn::Waiting,
        })
    }

    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        self.reachable()?;
        lock(&self.store.state).leave_queue(key, lease_id, crate::values::clock::now());
        Ok(())
    }

    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        self.reachable()?;
        let state = lock(&self.store.state);
        let wake = state
            .slots
            .get(&slot_key(request.key()))
            .and_then(|slot| {
                slot.waiters
                    .iter()
                    .find(|w| w.lease_id == request.lease_id())
            })
            .map(|waiter| Arc::clone(&waiter.wake));
        Ok(wake.map(|wake| Box::new(TurnWatch(wake)) as Box<dyn KeyWatch>))
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        self.reachable()?;
        let now = crate::values::clock::now();
        let mut state = lock(&self.store.state);
        match state.records.get(key) {
            Some((record, until)) if now < *until => Ok(Some(record.clone())),
            Some(_) => {
                state.records.remove(key);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        self.reachable()?;
        Record::retention_millis(retention)?;
        let until = crate::values::clock::now()
            .checked_add(retention)
            .ok_or_else(|| Error::invalid(format!("retention {retention:?} is too large")))?;
        let now = crate::values::clock::now();
        let mut state = lock(&self.store.state);
        let alive = state.alive(now);
        let holds = state.slots.get(key).is_some_and(|slot| {
            slot.holders
                .iter()
                .any(|entry| entry.lease_id == lease_id && entry.lives(alive))
        });
        if holds {
            state.records.insert(key.clone(), (record.clone(), until));
        }
        Ok(Ownership::held_if(holds))
    }
}

/// A fair waiter's wake-ups: the store notifies only the waiters it would admit now.
struct TurnWatch(Arc<Notify>);

#[async_trait]
impl KeyWatch for TurnWatch {
    async fn changed(&mut self) -> Result<Change> {
        self.0.notified().await;
        Ok(Change::Released)
    }
}
