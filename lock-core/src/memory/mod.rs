//! The in-memory reference backend, and [`MemoryLink`] to cut its clients off in tests.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend::{
    lock_unpoisoned as lock, AcquireRequest, Capabilities, Change, Grant, HolderInfo, KeyWatch,
    Liveness, LockBackend, Ownership, Record, ReleaseFeed, Turn,
};
use crate::values::error::{Error, Result};
use crate::values::key::{LockKey, Primitive};
use crate::values::lease::LeaseId;

mod sessions;
mod slots;
mod state;

use sessions::ClientSessions;
pub use sessions::MemoryLink;
use slots::{announce, feed_name, slot_key, News};
use state::{State, Stay};

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
        Ok(lock(&self.store.state).renew(key, lease_id, expires_at, ttl, now))
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
        let holds = state.holds(key, lease_id, now);
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
