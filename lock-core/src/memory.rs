//! The in-memory reference backend.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::backend::{KeyWatch, LockBackend, LockInfo};
use crate::capabilities::Capabilities;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::lock;
use crate::key::LockKey;
use crate::lease::{AcquireRequest, FencingToken, Lease, LeaseId};
use crate::notify::ReleaseFeed;
use crate::options::{saturating_add, WaitSpec};

/// Locks kept in this process's memory: every capability, for tests, examples and for
/// coordinating tasks of one process.
///
/// Clones share the same store, as several clients of one server would. Tokens come from
/// one counter for the whole store, so they grow across every key, release and takeover
/// and nothing per key outlives a release. Expired leases are swept lazily.
///
/// With [`MemoryBackend::fair`] waiters are granted the key in arrival order; a waiter
/// that gives up or is dropped leaves the queue at once.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    store: Arc<Store>,
    capabilities: Capabilities,
}

#[derive(Debug)]
struct Store {
    state: Mutex<State>,
    releases: ReleaseFeed,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<LockKey, Entry>,
    queues: HashMap<LockKey, VecDeque<Waiter>>,
    last_token: u64,
    writes_since_sweep: usize,
}

#[derive(Debug)]
struct Entry {
    lease_id: LeaseId,
    token: FencingToken,
    expires_at: Instant,
}

#[derive(Debug)]
struct Waiter {
    lease_id: LeaseId,
    wake: Arc<Notify>,
}

impl Entry {
    fn is_live(&self, now: Instant) -> bool {
        now < self.expires_at
    }
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
                ..Capabilities::default()
            },
        }
    }

    /// Keys the store keeps anything for (held or expired leases, queued waiters): for
    /// tests that check nothing is left behind.
    pub fn stored_keys(&self) -> Vec<LockKey> {
        let state = lock(&self.store.state);
        let mut keys: Vec<LockKey> = state
            .locks
            .keys()
            .chain(state.queues.keys())
            .cloned()
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn expiry(&self, ttl: Duration) -> Result<Instant> {
        Instant::now()
            .checked_add(self.capabilities.store_ttl(ttl))
            .ok_or_else(|| Error::invalid(format!("TTL {ttl:?} is too large")))
    }
}

impl State {
    /// Grants `request` if the key is free, expired or already its own; in a fair store
    /// only the head of the queue (or anyone, when nobody queues) may take a free key.
    fn grant(
        &mut self,
        request: &AcquireRequest,
        expires_at: Instant,
        fair: bool,
    ) -> Option<FencingToken> {
        let now = Instant::now();
        self.sweep(now);
        match self.locks.get_mut(request.key()) {
            Some(entry) if entry.lease_id == request.lease_id() && entry.is_live(now) => {
                entry.expires_at = expires_at;
                return Some(entry.token);
            }
            Some(entry) if entry.is_live(now) => return None,
            _ => {}
        }
        if fair {
            let head = self
                .queues
                .get(request.key())
                .and_then(|queue| queue.front());
            if head.is_some_and(|waiter| waiter.lease_id != request.lease_id()) {
                return None;
            }
        }
        self.last_token += 1;
        let token = FencingToken::new(self.last_token);
        self.locks.insert(
            request.key().clone(),
            Entry {
                lease_id: request.lease_id(),
                token,
                expires_at,
            },
        );
        Some(token)
    }

    /// Drops expired entries now and then, so crashed holders do not accumulate.
    fn sweep(&mut self, now: Instant) {
        self.writes_since_sweep += 1;
        if self.writes_since_sweep >= 1024.max(self.locks.len()) {
            self.writes_since_sweep = 0;
            self.locks.retain(|_, entry| entry.is_live(now));
        }
    }

    fn wake_head(&self, key: &LockKey) {
        if let Some(head) = self.queues.get(key).and_then(|queue| queue.front()) {
            head.wake.notify_one();
        }
    }

    fn leave_queue(&mut self, key: &LockKey, lease_id: LeaseId) {
        if let Some(queue) = self.queues.get_mut(key) {
            queue.retain(|waiter| waiter.lease_id != lease_id);
            if queue.is_empty() {
                self.queues.remove(key);
            } else {
                self.wake_head(key);
            }
        }
    }

    fn holder_expiry(&self, key: &LockKey) -> Option<Instant> {
        self.locks.get(key).map(|entry| entry.expires_at)
    }
}

/// Removes a fair waiter from its queue however its wait ends (granted, timed out,
/// dropped), handing the turn to the next waiter.
struct QueuePlace<'a> {
    backend: &'a MemoryBackend,
    key: LockKey,
    lease_id: LeaseId,
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        lock(&self.backend.store.state).leave_queue(&self.key, self.lease_id);
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

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<FencingToken>> {
        let expires_at = self.expiry(request.ttl())?;
        Ok(lock(&self.store.state).grant(request, expires_at, self.capabilities.fair_ordering))
    }

    async fn acquire(&self, request: &AcquireRequest, wait: &WaitSpec) -> Result<Lease> {
        if !self.capabilities.fair_ordering {
            return crate::wait::acquire_by_polling(self, request, wait).await;
        }
        let wake = Arc::new(Notify::new());
        let key = request.key().clone();
        let _place = {
            let mut state = lock(&self.store.state);
            let sent_at = Instant::now();
            if let Some(token) = state.grant(request, self.expiry(request.ttl())?, true) {
                return Ok(request.grant(token, sent_at));
            }
            state
                .queues
                .entry(key.clone())
                .or_default()
                .push_back(Waiter {
                    lease_id: request.lease_id(),
                    wake: Arc::clone(&wake),
                });
            QueuePlace {
                backend: self,
                key: key.clone(),
                lease_id: request.lease_id(),
            }
        };
        loop {
            // Sleep until woken by a release, or until the holder's lease would expire
            // (a crashed holder never releases), or until the wait ends.
            let holder_expiry = lock(&self.store.state).holder_expiry(&key);
            let mut until =
                holder_expiry.unwrap_or_else(|| saturating_add(Instant::now(), wait.backoff.max));
            if let Some(bound) = wait.until {
                until = until.min(bound);
            }
            tokio::select! {
                () = wake.notified() => {}
                () = sleep_until(TokioInstant::from_std(until)) => {}
            }
            {
                let mut state = lock(&self.store.state);
                let sent_at = Instant::now();
                if let Some(token) = state.grant(request, self.expiry(request.ttl())?, true) {
                    return Ok(request.grant(token, sent_at));
                }
            }
            if wait.until.is_some_and(|bound| Instant::now() >= bound) {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!("{:?} stayed held for the whole wait", key.as_str()),
                ));
            }
        }
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool> {
        let expires_at = self.expiry(ttl)?;
        let now = Instant::now();
        let mut state = lock(&self.store.state);
        match state.locks.get_mut(key) {
            Some(entry) if entry.lease_id == lease_id && entry.is_live(now) => {
                entry.expires_at = expires_at;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
        let now = Instant::now();
        let live = {
            let mut state = lock(&self.store.state);
            let Some(entry) = state
                .locks
                .get(key)
                .filter(|entry| entry.lease_id == lease_id)
            else {
                return Ok(false);
            };
            let live = entry.is_live(now);
            state.locks.remove(key);
            state.wake_head(key);
            live
        };
        self.store.releases.released(key.as_str());
        Ok(live)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let state = lock(&self.store.state);
        let waiters = self
            .capabilities
            .fair_ordering
            .then(|| state.queues.get(key).map_or(0, VecDeque::len));
        Ok(state
            .locks
            .get(key)
            .filter(|entry| entry.is_live(now))
            .map(|entry| LockInfo {
                lease_id: entry.lease_id,
                token: entry.token,
                remaining_ttl: entry.expires_at - now,
                waiters,
            }))
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        Ok(Some(self.store.releases.watch(key.as_str())))
    }
}
