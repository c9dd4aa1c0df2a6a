//! The in-memory reference backend, and [`MemoryLink`] to cut its clients off in tests.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend::{
    lock_unpoisoned as lock, AcquireRequest, Capabilities, Change, Grant, HolderInfo, KeyWatch,
    Liveness, LockBackend, Ownership, Record, ReleaseFeed, Turn,
};
use crate::values::error::{Error, Result};
use crate::values::key::LockKey;
use crate::values::lease::{FencingToken, LeaseId};

mod sessions;

use sessions::ClientSessions;
pub use sessions::MemoryLink;

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
    locks: HashMap<LockKey, Entry>,
    queues: HashMap<LockKey, VecDeque<Waiter>>,
    /// Live sessions and when the store ends each unless kept alive.
    sessions: HashMap<u64, Instant>,
    last_session: u64,
    last_token: u64,
    writes_since_sweep: usize,
    /// Idempotency records and when each is forgotten.
    records: HashMap<LockKey, (Record, Instant)>,
}

#[derive(Debug)]
struct Entry {
    lease_id: LeaseId,
    token: FencingToken,
    expires_at: Instant,
    session: Option<u64>,
    holder: Option<Arc<str>>,
}

#[derive(Debug)]
struct Waiter {
    lease_id: LeaseId,
    expires_at: Instant,
    /// In session mode, the session an automatically renewed waiter's entry lives by, as
    /// on etcd and ZooKeeper: its own polls do not keep it, the session's keep-alives do.
    session: Option<u64>,
    wake: Arc<Notify>,
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
                state: Mutex::new(State::default()),
                releases: ReleaseFeed::new(),
            }),
            capabilities: Capabilities {
                fair_ordering: fair,
                native_notification: true,
                durable_fencing: true,
                reentrancy: true,
                records: true,
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

    /// In session mode, ends the session that keeps `key`'s holder, from the store's side
    /// and with the holder's link healthy, as a server ends a session it has given up on
    /// (etcd revoking its lease, ZooKeeper expiring it): every lock of that session is
    /// free at once, and its client learns of the end at its next keep-alive. `false` when
    /// no live session holds `key`.
    pub fn end_session_holding(&self, key: &LockKey) -> bool {
        let freed: Vec<LockKey> = {
            let mut state = lock(&self.store.state);
            let now = crate::values::clock::now();
            let session = match state.locks.get(key) {
                Some(entry) if state.is_live(entry, now) => entry.session,
                _ => None,
            };
            let Some(session) = session else {
                return false;
            };
            state.sessions.remove(&session);
            let freed: Vec<LockKey> = state
                .locks
                .iter()
                .filter(|(_, entry)| entry.session == Some(session))
                .map(|(key, _)| key.clone())
                .collect();
            for key in &freed {
                state.locks.remove(key);
                state.wake_head(key);
            }
            freed
        };
        for key in &freed {
            self.store.releases.released(key.as_str());
        }
        true
    }

    /// How many live waiters a fair store has in `key`'s queue now (none in a store that
    /// is not fair): what the core's clean-ups leave behind, seen directly.
    pub fn queued(&self, key: &LockKey) -> usize {
        let state = lock(&self.store.state);
        let now = crate::values::clock::now();
        state.queues.get(key).map_or(0, |queue| {
            queue
                .iter()
                .filter(|waiter| live(&state.sessions, waiter.session, waiter.expires_at, now))
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

    /// The grant of `request` if the store gives it; `queued` for a waiter of a fair
    /// queue, which must be first in it.
    async fn grant(&self, request: &AcquireRequest, queued: bool) -> Result<Option<Grant>> {
        self.reachable()?;
        let expires_at = self.expiry(request.store_ttl())?;
        let session = match &self.sessions {
            Some(sessions) if !request.is_detached() => {
                Some(sessions.session_for(request, request.store_ttl()).await?)
            }
            _ => None,
        };
        let mut state = lock(&self.store.state);
        let now = crate::values::clock::now();
        if let Some(session) = &session {
            if state
                .sessions
                .get(&session.store_id)
                .is_none_or(|end| now >= *end)
            {
                // The client has not heard yet that the store ended the session: tell it,
                // so the retry of this attempt opens a new one.
                session.keeper.expired();
                return Err(Error::unavailable(
                    "the session ended before the grant; retrying under a new session",
                ));
            }
        }
        state.sweep(now);
        let live_holder = state
            .locks
            .get(request.key())
            .filter(|entry| state.is_live(entry, now))
            .map(|entry| entry.lease_id);
        let token = match live_holder {
            Some(holder) if holder != request.lease_id() => return Ok(None),
            Some(_) => {
                let entry = state.locks.get_mut(request.key()).ok_or_else(|| {
                    Error::new(crate::ErrorKind::Internal, "entry vanished under the lock")
                })?;
                entry.expires_at = expires_at;
                entry.token
            }
            None => {
                if self.capabilities.fair_ordering && !state.may_take(request, queued, now) {
                    return Ok(None);
                }
                state.last_token += 1;
                let token = FencingToken::new(state.last_token);
                state.locks.insert(
                    request.key().clone(),
                    Entry {
                        lease_id: request.lease_id(),
                        token,
                        expires_at,
                        session: session.as_ref().map(|s| s.store_id),
                        holder: request.holder_label().map(Arc::from),
                    },
                );
                token
            }
        };
        if queued {
            // The key is held again: the next waiter's turn comes with the release.
            if let Some(queue) = state.queues.get_mut(request.key()) {
                queue.retain(|waiter| waiter.lease_id != request.lease_id());
                if queue.is_empty() {
                    state.queues.remove(request.key());
                }
            }
        }
        Ok(Some(match session {
            Some(session) => Grant::in_session(token, session.keeper.session()),
            None => Grant::new(token),
        }))
    }
}

/// Whether an entry (a lease or a waiter) still lives: by its session where it has one,
/// by its own expiry otherwise.
fn live(
    sessions: &HashMap<u64, Instant>,
    session: Option<u64>,
    expires_at: Instant,
    now: Instant,
) -> bool {
    match session {
        Some(session) => sessions.get(&session).is_some_and(|end| now < *end),
        None => now < expires_at,
    }
}

impl State {
    fn is_live(&self, entry: &Entry, now: Instant) -> bool {
        live(&self.sessions, entry.session, entry.expires_at, now)
    }

    /// Whether a free key may go to `request` in a fair store: to the first live waiter,
    /// or to anyone when nobody waits. Dead waiters are dropped on the way.
    fn may_take(&mut self, request: &AcquireRequest, queued: bool, now: Instant) -> bool {
        self.prune_queue(request.key(), now);
        match self.queues.get(request.key()).and_then(VecDeque::front) {
            None => !queued,
            Some(head) => queued && head.lease_id == request.lease_id(),
        }
    }

    /// Drops waiters whose entries expired (their waiter died), waking the new head.
    fn prune_queue(&mut self, key: &LockKey, now: Instant) {
        let sessions = &self.sessions;
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        let head = queue.front().map(|w| w.lease_id);
        queue.retain(|waiter| live(sessions, waiter.session, waiter.expires_at, now));
        if queue.is_empty() {
            self.queues.remove(key);
        } else if queue.front().map(|w| w.lease_id) != head {
            self.wake_head(key);
        }
    }

    /// Drops expired entries and sessions now and then, so crashed holders do not
    /// accumulate.
    fn sweep(&mut self, now: Instant) {
        self.writes_since_sweep += 1;
        if self.writes_since_sweep >= 1024.max(self.locks.len()) {
            self.writes_since_sweep = 0;
            self.sessions.retain(|_, end| now < *end);
            let sessions = &self.sessions;
            self.locks
                .retain(|_, entry| live(sessions, entry.session, entry.expires_at, now));
            self.records.retain(|_, (_, until)| now < *until);
        }
    }

    fn wake_head(&self, key: &LockKey) {
        if let Some(head) = self.queues.get(key).and_then(|queue| queue.front()) {
            head.wake.notify_one();
        }
    }

    fn leave_queue(&mut self, key: &LockKey, lease_id: LeaseId) {
        if let Some(queue) = self.queues.get_mut(key) {
            let was_head = queue.front().is_some_and(|w| w.lease_id == lease_id);
            queue.retain(|waiter| waiter.lease_id != lease_id);
            if queue.is_empty() {
                self.queues.remove(key);
            } else if was_head {
                self.wake_head(key);
            }
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
        self.grant(request, false).await
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.reachable()?;
        let expires_at = self.expiry(ttl)?;
        let now = crate::values::clock::now();
        let mut state = lock(&self.store.state);
        let session = match state.locks.get(key) {
            Some(entry) if entry.lease_id == lease_id && state.is_live(entry, now) => entry.session,
            _ => return Ok(Ownership::NotHeld),
        };
        match session {
            Some(session) => Ok(Ownership::held_if(state.keep_alive(session, ttl))),
            None => {
                if let Some(entry) = state.locks.get_mut(key) {
                    entry.expires_at = expires_at;
                }
                Ok(Ownership::Held)
            }
        }
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.reachable()?;
        let now = crate::values::clock::now();
        let live = {
            let mut state = lock(&self.store.state);
            let Some(entry) = state
                .locks
                .get(key)
                .filter(|entry| entry.lease_id == lease_id)
            else {
                return Ok(Ownership::NotHeld);
            };
            let live = state.is_live(entry, now);
            state.locks.remove(key);
            state.wake_head(key);
            live
        };
        self.store.releases.released(key.as_str());
        Ok(Ownership::held_if(live))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        self.reachable()?;
        let now = crate::values::clock::now();
        let mut state = lock(&self.store.state);
        if self.capabilities.fair_ordering {
            state.prune_queue(key, now);
        }
        let waiters = self
            .capabilities
            .fair_ordering
            .then(|| state.queues.get(key).map_or(0, VecDeque::len));
        Ok(state
            .locks
            .get(key)
            .filter(|entry| state.is_live(entry, now))
            .map(|entry| {
                let end = match entry.session {
                    Some(session) => state.sessions.get(&session).copied().unwrap_or(now),
                    None => entry.expires_at,
                };
                HolderInfo {
                    lease_id: entry.lease_id,
                    token: entry.token,
                    remaining_ttl: end.saturating_duration_since(now),
                    waiters,
                    holder: entry.holder.as_deref().map(String::from),
                    kind: crate::HoldKind::Mutex,
                }
            }))
    }

    /// Held or expired leases and queued waiters, whatever their state.
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.reachable()?;
        let state = lock(&self.store.state);
        let mut keys: Vec<String> = state
            .locks
            .keys()
            .chain(state.queues.keys())
            .map(LockKey::as_str)
            .filter(|key| key.starts_with(prefix))
            .map(String::from)
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let mut keys: Vec<LockKey> = {
            self.reachable()?;
            let state = lock(&self.store.state);
            state
                .locks
                .keys()
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
        Ok(Some(self.store.releases.watch(key.as_str())))
    }

    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        self.reachable()?;
        if !self.capabilities.fair_ordering {
            return Err(crate::backend::no_queue(self.name()));
        }
        let expires_at = self.expiry(request.store_ttl())?;
        let session = match &self.sessions {
            Some(sessions) if request.renewal() == crate::Renewal::Auto => Some(
                sessions
                    .session_for(request, request.store_ttl())
                    .await?
                    .store_id,
            ),
            _ => None,
        };
        let mut state = lock(&self.store.state);
        if let Some(session) = session {
            if state
                .sessions
                .get(&session)
                .is_none_or(|end| crate::values::clock::now() >= *end)
            {
                return Err(Error::unavailable(
                    "the session ended before the enqueue; retrying under a new session",
                ));
            }
        }
        let queue = state.queues.entry(request.key().clone()).or_default();
        match queue.iter_mut().find(|w| w.lease_id == request.lease_id()) {
            Some(waiter) => waiter.expires_at = expires_at,
            None => queue.push_back(Waiter {
                lease_id: request.lease_id(),
                expires_at,
                session,
                wake: Arc::new(Notify::new()),
            }),
        }
        Ok(())
    }

    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        self.reachable()?;
        if !self.capabilities.fair_ordering {
            return Err(crate::backend::no_queue(self.name()));
        }
        {
            let expires_at = self.expiry(request.ttl())?;
            let mut state = lock(&self.store.state);
            state.prune_queue(request.key(), crate::values::clock::now());
            let own = state
                .queues
                .get_mut(request.key())
                .and_then(|queue| queue.iter_mut().find(|w| w.lease_id == request.lease_id()));
            match own {
                // A live waiter's poll keeps its entry alive.
                Some(waiter) => waiter.expires_at = expires_at,
                None => return Ok(Turn::NotQueued),
            }
        }
        Ok(match self.grant(request, true).await? {
            Some(grant) => Turn::Granted(grant),
            None => Turn::Waiting,
        })
    }

    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        self.reachable()?;
        lock(&self.store.state).leave_queue(key, lease_id);
        Ok(())
    }

    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        self.reachable()?;
        let state = lock(&self.store.state);
        let wake = state
            .queues
            .get(request.key())
            .and_then(|queue| queue.iter().find(|w| w.lease_id == request.lease_id()))
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
        let holds = state
            .locks
            .get(key)
            .is_some_and(|entry| entry.lease_id == lease_id && state.is_live(entry, now));
        if holds {
            state.records.insert(key.clone(), (record.clone(), until));
        }
        Ok(Ownership::held_if(holds))
    }
}

/// A fair waiter's wake-ups: the store notifies the head of the queue only.
struct TurnWatch(Arc<Notify>);

#[async_trait]
impl KeyWatch for TurnWatch {
    async fn changed(&mut self) -> Result<Change> {
        self.0.notified().await;
        Ok(Change::Released)
    }
}
