//! Deliberately broken stores, for proving that the checker catches what it claims to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::backend::{
    async_trait, lock_unpoisoned, AcquireRequest, DynBackend, Grant, HolderInfo, KeyWatch,
    LeaseRenewal, LockBackend, Ownership, Record, Turn,
};
use lock_core::defects::CoreDefect;
use lock_core::{Capabilities, FencingToken, LeaseId, LockKey, Result};

/// A defect a run has: of the store ([`Broken`] applies it) or of the core itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// An attempt on a held key is granted anyway (with a token above the holder's).
    GrantWhileHeld,
    /// A new owner of a key gets the first owner's token again.
    StaleToken,
    /// A waiter's leave is answered but not applied: its queue entry stays.
    LeaveIgnored,
    /// The store is correct; the core is broken (`lock_core::defects`, in force on the
    /// run's thread for the whole run).
    Core(CoreDefect),
}

/// Wraps a store and breaks its acquisitions by a [`Defect`]; everything else is
/// forwarded. One `Broken` per client, sharing `first_tokens`.
#[derive(Debug)]
pub struct Broken {
    inner: DynBackend,
    defect: Defect,
    first_tokens: Arc<Mutex<HashMap<LockKey, FencingToken>>>,
}

impl Broken {
    /// `inner` with `defect`; clients of one store share `first_tokens`.
    pub fn new(
        inner: DynBackend,
        defect: Defect,
        first_tokens: Arc<Mutex<HashMap<LockKey, FencingToken>>>,
    ) -> Self {
        Broken {
            inner,
            defect,
            first_tokens,
        }
    }

    async fn broken(&self, key: &LockKey, grant: Option<Grant>) -> Result<Option<Grant>> {
        match (self.defect, grant) {
            (Defect::GrantWhileHeld, None) => Ok(self
                .inner
                .inspect(key)
                .await?
                .map(|holder| Grant::new(FencingToken::new(holder.token.get() + 1000)))),
            (Defect::StaleToken, Some(grant)) => {
                let mut first = lock_unpoisoned(&self.first_tokens);
                Ok(Some(Grant::new(
                    *first.entry(key.clone()).or_insert(grant.token()),
                )))
            }
            (_, grant) => Ok(grant),
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl LockBackend for Broken {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let grant = self.inner.try_acquire(request).await?;
        self.broken(request.key(), grant).await
    }
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<Option<Vec<Grant>>> {
        self.inner.try_acquire_all(requests).await
    }
    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.inner.renew(key, lease_id, ttl).await
    }
    async fn expire_in(&self, key: &LockKey, id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.inner.expire_in(key, id, ttl).await
    }
    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        self.inner.renew_many(leases).await
    }
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.inner.release(key, lease_id).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        self.inner.inspect(key).await
    }
    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        self.inner.holders(key).await
    }
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        self.inner.list_held(prefix, limit).await
    }
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.stored_keys(prefix).await
    }
    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        self.inner.watch(key).await
    }
    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        self.inner.enqueue(request).await
    }
    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        self.inner.try_acquire_queued(request).await
    }
    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        if self.defect == Defect::LeaveIgnored {
            return Ok(());
        }
        self.inner.leave_queue(key, lease_id).await
    }
    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        self.inner.watch_turn(request).await
    }
    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        self.inner.read_record(key).await
    }
    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        self.inner
            .write_record(key, lease_id, record, retention)
            .await
    }
}
