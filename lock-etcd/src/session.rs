//! The client's etcd leases ("sessions"), pooled by the core's [`SessionPool`]: one per
//! distinct TTL for automatically renewed locks, one per lock renewed by hand. What is
//! etcd's here: a lease grant, one keep-alive (a stream opened for it, which sends it and
//! waits for its answer) and a revoke; the pool does the cadence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::Client;
use lock_core::backend::{
    async_trait, with_timeout, AcquireRequest, PooledSession, SessionKeeper, SessionKind,
    SessionNews, SessionPool, SessionStore,
};
use lock_core::{Error, ErrorKind, LeaseId, Result};

use crate::error::{into_error, is_lease_not_found};

/// One etcd lease of this client.
#[derive(Debug)]
pub(crate) struct EtcdSession {
    /// The etcd lease id entries are attached to.
    pub(crate) lease: i64,
    pub(crate) keeper: SessionKeeper,
}

impl PooledSession for EtcdSession {
    fn keeper(&self) -> &SessionKeeper {
        &self.keeper
    }
}

impl EtcdSession {
    /// A session of etcd lease `lease` that nothing keeps alive, for unit tests.
    #[cfg(test)]
    pub(crate) fn detached(lease: i64) -> Self {
        EtcdSession {
            lease,
            keeper: SessionKeeper::new(Instant::now(), Duration::from_secs(10)),
        }
    }

    /// The store ended the lease: every entry on it is gone.
    pub(crate) fn ended(&self) {
        self.keeper.expired();
    }
}

/// Every session of one client. Dropping it revokes their leases, so their entries go
/// now, not a TTL later.
#[derive(Debug)]
pub(crate) struct Sessions {
    pool: SessionPool<EtcdStore>,
}

impl Sessions {
    pub(crate) fn new(client: Client, request_timeout: Duration) -> Self {
        Sessions {
            pool: SessionPool::new(EtcdStore {
                client,
                request_timeout,
            }),
        }
    }

    /// The live session `request` lives by (of `ttl`, whole seconds), granting a new etcd
    /// lease when there is none. `own`: every lock has a lease of its own (the etcd-mutex
    /// layout, where the entry is named by its lease).
    pub(crate) async fn session(
        &self,
        request: &AcquireRequest,
        own: bool,
        ttl: Duration,
    ) -> Result<Arc<EtcdSession>> {
        let kind = if own {
            SessionKind::own(request)
        } else {
            SessionKind::shared(request, ttl)
        };
        self.pool.session(kind, ttl).await
    }

    /// Sends one keep-alive for `session` now and waits for its answer: `false` when the
    /// lease is gone.
    pub(crate) async fn ping(&self, session: &Arc<EtcdSession>) -> Result<bool> {
        match self.pool.keep_alive_now(session).await {
            SessionNews::Alive => Ok(true),
            SessionNews::Ended => Ok(false),
            SessionNews::Unanswered => Err(Error::new(
                ErrorKind::Unavailable,
                "etcd: a keep-alive went unanswered",
            )),
        }
    }

    /// The open session whose etcd lease is `lease`, if any.
    pub(crate) fn by_lease(&self, lease: i64) -> Option<Arc<EtcdSession>> {
        self.pool
            .sessions()
            .into_iter()
            .find_map(|(_, session)| (session.lease == lease).then_some(session))
    }

    /// The live sessions shared by automatically renewed locks (one per TTL in use). A
    /// session being opened right now is not among them.
    pub(crate) fn live_shared(&self) -> Vec<Arc<EtcdSession>> {
        self.pool
            .sessions()
            .into_iter()
            .filter(|(kind, session)| {
                matches!(kind, SessionKind::Shared(_)) && !session.keeper.status().expired
            })
            .map(|(_, session)| session)
            .collect()
    }

    /// Ends a lock's own session in the background: its etcd lease is revoked (an entry
    /// left on it goes with it).
    pub(crate) fn end_own(&self, lease_id: LeaseId) {
        self.pool.close_own(lease_id);
    }

    /// Ends a lock's own session now, if this client has one for `lease_id`: revoking its
    /// etcd lease deletes the lock's entry in the same step. `Some(true)` if the lease
    /// (and so the entry) was still there, `None` when there is no such session.
    pub(crate) async fn revoke_own(&self, lease_id: LeaseId) -> Option<Result<bool>> {
        let session = self.pool.take_own(lease_id).await?;
        session.ended();
        let store = self.pool.store();
        Some(revoke(&store.client, session.lease, store.request_timeout).await)
    }
}

/// etcd's side of the pool.
struct EtcdStore {
    client: Client,
    request_timeout: Duration,
}

#[async_trait]
impl SessionStore for EtcdStore {
    type Session = EtcdSession;

    fn name(&self) -> &'static str {
        "etcd"
    }

    /// Grants an etcd lease of `ttl` (whole seconds).
    async fn open(&self, kind: SessionKind, ttl: Duration) -> Result<EtcdSession> {
        let sent_at = Instant::now();
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let granting = async {
            self.client
                .lease_client()
                .grant(secs, None)
                .await
                .map_err(|err| into_error(err, "granting a lease"))
        };
        let granted =
            with_timeout("etcd", self.request_timeout, "granting a lease", granting).await?;
        tracing::debug!(lease = granted.id(), ?kind, ?ttl, "etcd lease granted");
        Ok(EtcdSession {
            lease: granted.id(),
            keeper: SessionKeeper::new(sent_at, ttl),
        })
    }

    /// One keep-alive: opening a keep-alive stream sends one and waits for its answer
    /// (which says whether the lease is still there).
    async fn keep_alive(&self, session: &EtcdSession) -> SessionNews {
        let opening = async { Ok(self.client.lease_client().keep_alive(session.lease).await) };
        match with_timeout("etcd", self.request_timeout, "a keep-alive", opening).await {
            Ok(Ok(_)) => SessionNews::Alive,
            Ok(Err(err)) if is_lease_not_found(&err) => SessionNews::Ended,
            _ => SessionNews::Unanswered,
        }
    }

    /// Every quarter of the TTL: with up to three keep-alives under way, a deadline then
    /// never waits on one slow answer.
    fn keep_alive_every(&self, session: &EtcdSession) -> Duration {
        session.keeper.status().ttl / 4
    }

    /// Revokes the session's etcd lease.
    async fn close(&self, session: Arc<EtcdSession>) {
        let _ = revoke(&self.client, session.lease, self.request_timeout).await;
    }
}

/// Revokes an etcd lease: `false` when the store no longer had it.
pub(crate) async fn revoke(client: &Client, lease: i64, bound: Duration) -> Result<bool> {
    let revoking = async { Ok(client.lease_client().revoke(lease).await) };
    match with_timeout("etcd", bound, "revoking a lease", revoking).await? {
        Ok(_) => Ok(true),
        Err(err) if is_lease_not_found(&err) => Ok(false),
        Err(err) => {
            tracing::debug!(lease, error = %err, "revoking an etcd lease failed; it expires by its TTL");
            Err(into_error(err, "revoking a lease"))
        }
    }
}
