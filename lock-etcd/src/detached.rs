//! Detached holds (once tickets, [`AcquireRequest::detached`]): a lock entry on an etcd
//! lease of its own that is none of the client's sessions. Nothing keeps that lease alive
//! and nothing revokes it when the client closes or is dropped, so the hold lives by its
//! TTL alone, on the cluster's clock.
//!
//! The client remembers each such lease until the hold is released, or its lease has run
//! out, so that a retried acquisition keeps the lease its entry may already be on and a
//! release revokes it.
//!
//! [`AcquireRequest::detached`]: lock_core::backend::AcquireRequest::detached

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::Client;
use lock_core::backend::{lock_unpoisoned as lock, with_timeout, SessionKeeper};
use lock_core::{LeaseId, Result};

use crate::error::{into_error, is_lease_not_found};
use crate::session::{revoke, EtcdSession};

/// The etcd leases of this client's detached holds, by acquisition.
pub(crate) struct DetachedLeases {
    client: Client,
    request_timeout: Duration,
    leases: Mutex<HashMap<LeaseId, Arc<EtcdSession>>>,
}

impl DetachedLeases {
    pub(crate) fn new(client: Client, request_timeout: Duration) -> Self {
        DetachedLeases {
            client,
            request_timeout,
            leases: Mutex::default(),
        }
    }

    /// The lease acquisition `lease_id` puts its entry on, of `ttl`. A retry (an earlier
    /// attempt's reply was lost, and its entry may be on that attempt's lease) keeps the
    /// earlier lease, restarted by one keep-alive: the core counts the hold's deadline
    /// from this attempt, so the store must too. Otherwise a new lease.
    pub(crate) async fn lease_for(
        &self,
        lease_id: LeaseId,
        ttl: Duration,
    ) -> Result<Arc<EtcdSession>> {
        if let Some(earlier) = self.lease_of(lease_id) {
            let sent_at = Instant::now();
            let what = "restarting a hold's lease";
            let restarting =
                async { Ok(self.client.lease_client().keep_alive(earlier.lease).await) };
            match with_timeout("etcd", self.request_timeout, what, restarting).await? {
                Ok(_) => {
                    earlier.keeper.kept_alive(sent_at);
                    return Ok(earlier);
                }
                // Gone, and the entry with it: a new lease for a new entry.
                Err(err) if is_lease_not_found(&err) => earlier.ended(),
                Err(err) => return Err(into_error(err, what)),
            }
        }
        let lease = self.grant(ttl).await?;
        self.remember(lease_id, Arc::clone(&lease));
        Ok(lease)
    }

    /// A new etcd lease of `ttl` in whole seconds, rounded up, that nothing keeps alive.
    pub(crate) async fn grant(&self, ttl: Duration) -> Result<Arc<EtcdSession>> {
        let sent_at = Instant::now();
        let secs = i64::try_from(ttl.as_nanos().div_ceil(1_000_000_000))
            .unwrap_or(i64::MAX)
            .max(1);
        let what = "granting a hold's lease";
        let granting = async {
            let granted = self.client.lease_client().grant(secs, None).await;
            granted.map_err(|err| into_error(err, what))
        };
        let granted = with_timeout("etcd", self.request_timeout, what, granting).await?;
        Ok(Arc::new(EtcdSession {
            lease: granted.id(),
            keeper: SessionKeeper::new(sent_at, Duration::from_secs(secs.unsigned_abs())),
        }))
    }

    /// The lease of `lease_id`'s detached hold, if this client has one.
    pub(crate) fn lease_of(&self, lease_id: LeaseId) -> Option<Arc<EtcdSession>> {
        lock(&self.leases)
            .get(&lease_id)
            .filter(|lease| !lease.keeper.status().expired)
            .cloned()
    }

    /// `lease_id`'s hold is on `lease` now. Forgets the leases that have run out, so the
    /// record stays as small as the holds that may still be live.
    pub(crate) fn remember(&self, lease_id: LeaseId, lease: Arc<EtcdSession>) {
        let now = Instant::now();
        let mut leases = lock(&self.leases);
        leases.retain(|_, lease| {
            let status = lease.keeper.status();
            let end = status.proven_at.checked_add(status.ttl);
            !status.expired && end.is_none_or(|end| end > now)
        });
        leases.insert(lease_id, lease);
    }

    /// `lease_id`'s hold on `lease` is over: the client forgets it (unless the hold has
    /// moved to another lease since) and revokes `lease`.
    pub(crate) async fn end(&self, lease_id: LeaseId, lease: &EtcdSession) {
        {
            let mut leases = lock(&self.leases);
            if leases
                .get(&lease_id)
                .is_some_and(|l| l.lease == lease.lease)
            {
                leases.remove(&lease_id);
            }
        }
        self.revoke(lease).await;
    }

    /// [`end`](Self::end) in the background, for an attempt that got nothing.
    pub(crate) fn end_in_background(self: &Arc<Self>, lease_id: LeaseId, lease: Arc<EtcdSession>) {
        let leases = Arc::clone(self);
        tokio::spawn(async move { leases.end(lease_id, &lease).await });
    }

    /// Revokes `lease`, best effort: a lease left behind only runs out by its TTL.
    pub(crate) async fn revoke(&self, lease: &EtcdSession) {
        lease.ended();
        let _ = revoke(&self.client, lease.lease, self.request_timeout).await;
    }
}
