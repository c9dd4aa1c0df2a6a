//! The guard users keep while they hold a lock.

use std::future::Future;
use std::sync::Arc;

use crate::engine::held::HeldLock;
use crate::engine::reentry::Reentry;
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::{FencingToken, Lease};

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

    /// Resolves when the lease is lost: its local deadline passed without a successful
    /// renewal (or session keep-alive), or the store said it is no longer held. It fires
    /// before the store can grant the key to anyone else (the deadline ends a drift
    /// allowance before the store's expiry). It never resolves for a lease that was
    /// released.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move { held.wait_lost().await }
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
                return if self.held.is_held() {
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
