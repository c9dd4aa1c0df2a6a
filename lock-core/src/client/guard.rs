//! The guard users keep while they hold a lock.

use std::future::Future;
use std::sync::Arc;

use crate::engine::held::{HeldLock, LeaseHealth, LossReason};
use crate::engine::reentry::Reentry;
use crate::values::error::Result;
use crate::values::key::LockKey;
use crate::values::lease::{FencingToken, Lease};

/// Proof of holding a lock.
///
/// [`release`](Self::release) is the real way to give the lock back: it waits for the
/// store, and its result must be looked at. `Ok` means the lease was held until the
/// release; [`ErrorKind::Lost`](crate::ErrorKind) means it was lost before (expired, or
/// the store no longer had it), so whatever was done under the lock after that was not
/// protected. Dropping the guard releases in the background, best effort; if that cannot
/// reach the store the lease ends by its TTL.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    held: Arc<HeldLock>,
    reentry: Option<Reentry>,
    done: bool,
}

impl LockGuard {
    pub(crate) fn new(held: Arc<HeldLock>, reentry: Option<Reentry>) -> Self {
        LockGuard {
            held,
            reentry,
            done: false,
        }
    }

    pub(crate) fn held(&self) -> &Arc<HeldLock> {
        &self.held
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.held.key
    }

    /// The fencing token of this ownership: pass it to every resource the lock protects.
    pub fn token(&self) -> FencingToken {
        self.held.token
    }

    /// The current lease (its deadline moves with each renewal).
    pub fn lease(&self) -> Lease {
        self.held.lease()
    }

    /// Whether the lease is held and its local deadline is ahead. Cheap: no store call.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Resolves when the lease is lost, with the reason: its local deadline passed
    /// without a successful renewal (or session keep-alive), the store said it is no
    /// longer held, the store ended its session, or the hold reached
    /// [`max_hold`](crate::AcquireOptions::max_hold). A loss by deadline fires before the
    /// store can grant the key to anyone else (the deadline ends a drift allowance before
    /// the store's expiry). It never resolves for a lease that was released.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move { held.wait_loss().await }
    }

    /// Why the lease was lost, once it was; `None` while it is held or after a release.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.held.health().loss_reason()
    }

    /// How the lease is doing: [`LeaseHealth::Suspended`] as soon as a renewal fails (or
    /// the session loses its connection), well before the lease is lost, and
    /// [`LeaseHealth::Healthy`] again when a renewal is answered.
    pub fn health(&self) -> LeaseHealth {
        self.held.health()
    }

    /// Resolves with the new health when renewals start failing
    /// ([`LeaseHealth::Suspended`]) or the lease is lost: the early warning, for work
    /// that should pause while the lock may be slipping away. Resolves at once if the
    /// lease is not healthy now.
    pub fn renewal_trouble(&self) -> impl Future<Output = LeaseHealth> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move {
            held.wait_health(|health| *health != LeaseHealth::Healthy)
                .await
        }
    }

    /// Resolves with the new health when it is no longer `seen`: for a loop that follows
    /// every change (suspended, healthy again, lost).
    pub fn health_changed(
        &self,
        seen: LeaseHealth,
    ) -> impl Future<Output = LeaseHealth> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move { held.wait_health(|health| *health != seen).await }
    }

    /// Renews the lease now, for [`Renewal::Manual`](crate::Renewal) (allowed with
    /// automatic renewal too). A lease that is no longer held gives
    /// [`ErrorKind::Lost`](crate::ErrorKind).
    pub async fn renew(&self) -> Result<()> {
        self.held.renew_now().await
    }

    /// Gives the lock back.
    ///
    /// `Ok(())` when the lease was held until now; [`ErrorKind::Lost`](crate::ErrorKind)
    /// when it had been lost. The same at every depth of re-entry: an inner release of a
    /// reentrant owner's lock touches no store but still answers whether the lease is held,
    /// and only the outermost one gives the key back.
    ///
    /// Cancelling the returned future does not cancel the release: it goes on in the
    /// background, as for a dropped guard.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        if let Some(reentry) = self.reentry.take() {
            if !reentry.leave(&self.held) {
                // Given back by the client's shutdown: as good as released.
                return if self.held.is_held() || self.held.is_released() {
                    Ok(())
                } else {
                    Err(self.held.lost_error())
                };
            }
        }
        self.held.finish().await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(reentry) = self.reentry.take() {
            if !reentry.leave(&self.held) {
                return;
            }
        }
        let held = Arc::clone(&self.held);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = held.finish().await {
                    tracing::debug!(error = %err, "background release of a dropped guard: {err}");
                }
            });
        }
    }
}
