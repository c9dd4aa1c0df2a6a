//! The lock request builder users refine and `.await`.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::client::guard::LockGuard;
use crate::engine::acquire::{acquire_held, Keeping};
use crate::engine::reentry::{acquire_reentrant, OwnerState};
use crate::engine::ClientCore;
use crate::values::error::Result;
use crate::values::key::LockKey;
use crate::values::options::{AcquireOptions, LeaseSharing, Renewal, Wait};

/// A lock request: refine it with the builder methods, then `.await` it for a guard.
///
/// It owns everything it needs, so it can be stored, moved into a task or spawned
/// (`tokio::spawn(client.lock("k").into_future())`).
///
/// Options start from the client's defaults. [`options`](Self::options) replaces that
/// base; the single-option methods ([`ttl`](Self::ttl), [`wait`](Self::wait), ...) are
/// applied on top of the base whenever they were called, so no call order erases another.
///
/// The same builder serves a lock set ([`LockSetRequest`](crate::LockSetRequest), what
/// [`LockClient::lock_all`](crate::LockClient::lock_all) returns), whose options apply to
/// every key of the set and whose wait bounds the whole set.
#[must_use = "a lock request does nothing until awaited"]
#[derive(Debug)]
pub struct LockRequest<K = LockKey> {
    pub(crate) core: Arc<ClientCore>,
    pub(crate) owner: Option<Arc<OwnerState>>,
    pub(crate) key: Result<K>,
    base: AcquireOptions,
    ttl: Option<Duration>,
    wait: Option<Wait>,
    renewal: Option<Renewal>,
    holder_label: Option<Arc<str>>,
    lease_sharing: Option<LeaseSharing>,
    max_hold: Option<Duration>,
}

impl<K> LockRequest<K> {
    pub(crate) fn new(
        core: Arc<ClientCore>,
        owner: Option<Arc<OwnerState>>,
        key: Result<K>,
        defaults: AcquireOptions,
    ) -> Self {
        LockRequest {
            core,
            owner,
            key,
            base: defaults,
            ttl: None,
            wait: None,
            renewal: None,
            holder_label: None,
            lease_sharing: None,
            max_hold: None,
        }
    }

    /// How long the store keeps the lease without renewal.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for a held key.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Waits at most `bound`, then fails with [`ErrorKind::TimedOut`](crate::ErrorKind).
    pub fn wait_up_to(self, bound: Duration) -> Self {
        self.wait(Wait::UpTo(bound))
    }

    /// Fails at once with [`ErrorKind::HeldByAnother`](crate::ErrorKind) if the key is held.
    pub fn no_wait(self) -> Self {
        self.wait(Wait::No)
    }

    /// Who keeps the lease alive.
    pub fn renewal(mut self, renewal: Renewal) -> Self {
        self.renewal = Some(renewal);
        self
    }

    /// Labels the holder for [`LockClient::inspect`](crate::LockClient::inspect).
    pub fn holder_label(mut self, label: impl AsRef<str>) -> Self {
        self.holder_label = Some(Arc::from(label.as_ref()));
        self
    }

    /// Whether the lease may be handed to, and taken from, another task of this client
    /// waiting for the same key without a store round trip; see
    /// [`LeaseSharing::SharedWithLocalWaiters`] for the price (one shared fencing token).
    pub fn lease_sharing(mut self, sharing: LeaseSharing) -> Self {
        self.lease_sharing = Some(sharing);
        self
    }

    /// [`lease_sharing`](Self::lease_sharing) with
    /// [`LeaseSharing::SharedWithLocalWaiters`].
    pub fn share_lease_with_local_waiters(self) -> Self {
        self.lease_sharing(LeaseSharing::SharedWithLocalWaiters)
    }

    /// Caps how long the lock may be held: see [`AcquireOptions::max_hold`].
    pub fn max_hold(mut self, cap: Duration) -> Self {
        self.max_hold = Some(cap);
        self
    }

    /// Replaces the base options (the client's defaults). Single options set with the
    /// other methods still apply on top, before or after this call.
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.base = options;
        self
    }

    /// The options the request will be made with.
    pub fn effective_options(&self) -> AcquireOptions {
        let mut options = self.base.clone();
        if let Some(ttl) = self.ttl {
            options.ttl = ttl;
        }
        if let Some(wait) = self.wait {
            options.wait = wait;
        }
        if let Some(renewal) = self.renewal {
            options.renewal = renewal;
        }
        if let Some(label) = &self.holder_label {
            options.holder_label = Some(Arc::clone(label));
        }
        if let Some(sharing) = self.lease_sharing {
            options.lease_sharing = sharing;
        }
        if let Some(cap) = self.max_hold {
            options.max_hold = Some(cap);
        }
        options
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<LockGuard>> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        let options = self.effective_options();
        Box::pin(async move {
            let key = self.key?;
            match self.owner {
                Some(owner) => {
                    let (held, reentry) =
                        acquire_reentrant(&self.core, &owner, key, options).await?;
                    Ok(LockGuard::new(held, Some(reentry)))
                }
                None => Ok(LockGuard::new(
                    acquire_held(&self.core, key, options, Keeping::Renewed).await?,
                    None,
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::future::IntoFuture;
    use std::time::Duration;

    use crate::{AcquireOptions, LockClient, MemoryBackend, Renewal, Wait};

    /// Replacing the base options keeps the single options set before or after it.
    #[test]
    fn whole_options_do_not_erase_single_ones() {
        let client = LockClient::new(MemoryBackend::new());
        let base = AcquireOptions {
            ttl: Duration::from_secs(99),
            wait: Wait::Forever,
            ..AcquireOptions::default()
        };
        let options = client
            .lock("k")
            .ttl(Duration::from_secs(5))
            .options(base)
            .renewal(Renewal::Manual)
            .effective_options();
        assert_eq!(options.ttl, Duration::from_secs(5));
        assert_eq!(options.renewal, Renewal::Manual);
        assert_eq!(options.wait, Wait::Forever);
    }

    /// A request borrows nothing: it can outlive the client handle and run in a task.
    #[tokio::test]
    async fn a_request_can_be_spawned() {
        let request = LockClient::new(MemoryBackend::new()).lock("k").no_wait();
        let guard = tokio::spawn(request.into_future()).await.unwrap().unwrap();
        guard.release().await.unwrap();
    }
}
