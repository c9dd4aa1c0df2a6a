//! The trait a store implements, and the conveniences built on it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::{Error, ErrorKind, Result};
use crate::key::LockKey;
use crate::lease::{AcquireRequest, FencingToken, Lease, LeaseId};
use crate::options::WaitSpec;

/// A shareable, type-erased backend: what the client layer and the conformance suite hold.
pub type DynBackend = Arc<dyn LockBackend>;

/// Who holds a key right now, as the store sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder's lease id.
    pub lease_id: LeaseId,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// Time left before the store expires the lease, by the store's clock.
    pub remaining_ttl: Duration,
    /// How many acquisitions queue for the key, where the store keeps a queue (fair
    /// backends must report it); `None` when it does not know.
    pub waiters: Option<usize>,
}

/// How a release ended, from the releasing lease's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was live and is now released.
    Released,
    /// The lease was not held, and it cannot have expired yet: an earlier attempt (whose
    /// reply may have been lost) released it already. Nobody else's lock was touched.
    AlreadyReleased,
}

/// Notifications that a key may have become free. Spurious wake-ups are allowed; missed
/// ones are covered by the waiter's fallback poll.
#[async_trait]
pub trait KeyWatch: Send {
    /// Resolves when the key may have changed since the watch began or since the last call.
    async fn changed(&mut self) -> Result<()>;
}

/// The primitive operations of one store; the only trait a backend crate implements.
///
/// Every mutating operation is conditional on the lease id and idempotent under retry.
/// Waiting, renewal, reentrancy, lost-lock signalling, cancellation clean-up and tracing
/// live in the core on top of these operations.
#[async_trait]
pub trait LockBackend: fmt::Debug + Send + Sync + 'static {
    /// A short name for logs and reports (`"memory"`, `"redis"`, `"postgres"`, ...).
    fn name(&self) -> &'static str;

    /// What this backend guarantees; the same value for the life of the backend.
    fn capabilities(&self) -> &Capabilities;

    /// One atomic attempt: grants the key to `request.lease_id()` when it is free, when
    /// its lease expired, or when it is already held by that same lease id (a retry whose
    /// reply was lost: the same token is returned and the TTL starts again). Returns
    /// `Ok(None)` when a different live lease holds the key. A new grant's token is
    /// greater than every token issued before for the key.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<FencingToken>>;

    /// Waits for the key until `wait.until`. The default polls [`try_acquire`] with
    /// backoff, woken early by [`watch`] when the backend has native notification. A
    /// backend with its own fair queue overrides it; the lease it returns must measure its
    /// validity from the send time of the granting request ([`AcquireRequest::grant`]).
    ///
    /// [`try_acquire`]: LockBackend::try_acquire
    /// [`watch`]: LockBackend::watch
    async fn acquire(&self, request: &AcquireRequest, wait: &WaitSpec) -> Result<Lease> {
        crate::wait::acquire_by_polling(self, request, wait).await
    }

    /// Extends the live lease `lease_id` on `key` to `ttl` from now. Returns `false` when
    /// that lease is not live in the store (expired, released or replaced): the lease is
    /// lost, and nothing is changed.
    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool>;

    /// Removes the lease `lease_id` on `key` if it is live. Returns `false` when it was not
    /// live (never held, already released, expired, or replaced by another lease), in
    /// which case nothing else is touched. A backend that keeps expired entries may delete
    /// its own expired entry.
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool>;

    /// Who holds `key`, or `None` if it is free (expired leases count as free).
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>>;

    /// Subscribes to changes of `key`. `Ok(None)` (the default) means the backend has no
    /// native notification and waiters poll.
    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        let _ = key;
        Ok(None)
    }
}

/// Single operations with the contract's bookkeeping applied: TTL checks, send-time
/// measurement, a request timeout, lost/already-released classification and tracing.
/// Implemented for every backend; the client layer and the conformance suite use it.
#[async_trait]
pub trait LockBackendExt: LockBackend {
    /// One acquisition attempt. A held key is [`ErrorKind::HeldByAnother`].
    ///
    /// A grant whose reply arrives after the lease's local deadline is never returned:
    /// the store may already have given the key to someone else, so it counts as an
    /// unanswered attempt ([`ErrorKind::Unavailable`]) and a retry with the same lease id
    /// renews it or finds it gone.
    async fn acquire_once(&self, request: &AcquireRequest, timeout: Duration) -> Result<Lease> {
        self.capabilities().check_ttl(request.ttl())?;
        let sent_at = Instant::now();
        match with_timeout(timeout, "acquire", self.try_acquire(request)).await {
            Ok(Some(token)) => request.grant(token, sent_at).checked_on_arrival(request),
            Ok(None) => Err(held_by_another(request.key())),
            Err(err) => {
                if err.kind() == ErrorKind::Unavailable {
                    request.note_unanswered();
                }
                Err(err)
            }
        }
    }

    /// Renews `lease` for `ttl`. A lease that is not live any more is [`ErrorKind::Lost`].
    async fn renew_lease(&self, lease: &Lease, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.capabilities().check_ttl(ttl)?;
        let sent_at = Instant::now();
        if with_timeout(timeout, "renew", self.renew(lease.key(), lease.id(), ttl)).await? {
            Ok(lease.renewed(ttl, sent_at))
        } else {
            Err(Error::lost(format!(
                "lease on {:?} is no longer held",
                lease.key().as_str()
            )))
        }
    }

    /// Releases `lease`. When the store does not hold it, the outcome depends on the local
    /// deadline: before it, an earlier attempt released it
    /// ([`ReleaseOutcome::AlreadyReleased`]); after it, it may have expired
    /// ([`ErrorKind::Lost`]). Another holder's lock is never touched.
    async fn release_lease(&self, lease: &Lease, timeout: Duration) -> Result<ReleaseOutcome> {
        if with_timeout(timeout, "release", self.release(lease.key(), lease.id())).await? {
            Ok(ReleaseOutcome::Released)
        } else {
            lease.not_held_outcome()
        }
    }
}

impl<B: LockBackend + ?Sized> LockBackendExt for B {}

pub(crate) fn held_by_another(key: &LockKey) -> Error {
    Error::new(
        ErrorKind::HeldByAnother,
        format!("{:?} is held by another lease", key.as_str()),
    )
}

/// Bounds one store request, turning silence into [`ErrorKind::Unavailable`].
pub(crate) async fn with_timeout<T>(
    timeout: Duration,
    operation: &str,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(Error::unavailable(format!(
            "the store did not answer {operation} within {timeout:?}"
        ))),
    }
}

macro_rules! forward_backend {
    ($ty:ty) => {
        #[async_trait]
        impl<B: LockBackend + ?Sized> LockBackend for $ty {
            fn name(&self) -> &'static str {
                (**self).name()
            }
            fn capabilities(&self) -> &Capabilities {
                (**self).capabilities()
            }
            async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<FencingToken>> {
                (**self).try_acquire(request).await
            }
            async fn acquire(&self, request: &AcquireRequest, wait: &WaitSpec) -> Result<Lease> {
                (**self).acquire(request, wait).await
            }
            async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool> {
                (**self).renew(key, lease_id, ttl).await
            }
            async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
                (**self).release(key, lease_id).await
            }
            async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
                (**self).inspect(key).await
            }
            async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
                (**self).watch(key).await
            }
        }
    };
}

forward_backend!(Arc<B>);
forward_backend!(Box<B>);
