//! Scoped locking: run a future while a lock is held, and stop it the moment the lock is
//! lost.

use std::future::Future;
use std::sync::Arc;

use crate::client::request::LockRequest;
use crate::engine::held::HeldLock;
use crate::values::error::{Error, Result};
use crate::values::key::LockKey;
use crate::values::lease::{FencingToken, Lease};

/// What the body of [`LockClient::with_lock`](crate::LockClient::with_lock) (or
/// [`LockRequest::scoped`]) gets to know about the lock it runs under. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LockScope {
    held: Arc<HeldLock>,
}

impl LockScope {
    pub(crate) fn new(held: Arc<HeldLock>) -> Self {
        LockScope { held }
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

    /// Whether the lease is held and its local deadline is ahead.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }
}

impl LockRequest {
    /// Acquires the lock, runs `body` while it is held, then releases it.
    ///
    /// The body is **stopped** (its future dropped at its next await point) when the lock
    /// is lost, and the call fails with [`ErrorKind::Lost`](crate::ErrorKind): work must
    /// not go on under a lock that is gone. The loss signal fires before the store can
    /// grant the key to anyone else (see [`LockGuard::lost`](crate::LockGuard::lost)).
    ///
    /// A loss is reported even when the body finished first: if the release finds the
    /// lease lost, the call fails with `Lost`, because what the body did after the loss
    /// was not protected. Acquisition errors are returned as they come.
    ///
    /// The body's own errors are part of its output `T` (a `Result` inside the `Result`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{LockClient, MemoryBackend};
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let written = client
    ///     .lock("ledger")
    ///     .ttl(Duration::from_secs(5))
    ///     .scoped(|scope| async move { format!("written under token {}", scope.token()) })
    ///     .await?;
    /// assert!(written.starts_with("written under token"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn scoped<F, Fut, T>(self, body: F) -> Result<T>
    where
        F: FnOnce(LockScope) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.await?;
        let scope = LockScope::new(guard.held().clone());
        let lost = guard.lost();
        let body = body(scope);
        tokio::select! {
            // A loss wins over a body that completes in the same poll: its result cannot
            // be trusted.
            biased;
            _ = lost => {
                // The release reports the loss itself (and frees the local line).
                let lost = guard.release().await.err();
                Err(lost.unwrap_or_else(|| Error::lost("the lock was lost while the scoped body ran")))
            }
            value = body => guard.release().await.map(|()| value),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::{LockBackend, Ownership};
    use crate::{AcquireOptions, ErrorKind, LockClient, MemoryBackend, Renewal};

    /// A body that blocks its runtime past the local deadline (so the engine cannot mark
    /// the lease lost in time) but not past the store's expiry: the release still finds
    /// the lease in the store, and the call reports the loss anyway, as `is_held()` did.
    /// (It said `Ok` before: the blocking API's `with_lock` test failed so on a loaded
    /// machine.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_body_past_its_deadline_is_lost_though_the_store_still_holds() {
        let client = LockClient::new(MemoryBackend::new());
        let ttl = Duration::from_millis(400);
        let result = client
            .lock("k")
            .options(AcquireOptions {
                ttl,
                clock_drift: Some(Duration::from_millis(200)),
                renewal: Renewal::Manual,
                ..AcquireOptions::default()
            })
            .scoped(|scope| async move {
                std::thread::sleep(Duration::from_millis(250));
                scope.is_held()
            })
            .await;
        assert_eq!(result.map_err(|e| e.kind()), Err(ErrorKind::Lost));
    }

    /// The body finished, but the store had dropped the lease meanwhile (behind the
    /// holder's back, before its local deadline): the caller learns of the loss.
    #[tokio::test]
    async fn a_loss_found_at_release_is_reported_after_the_body() {
        let store = MemoryBackend::new();
        let client = LockClient::new(store.clone());
        let result = client
            .with_lock("k", |scope| async move {
                let dropped = store.release(scope.key(), scope.lease().id()).await;
                assert_eq!(dropped.ok(), Some(Ownership::Held));
                42
            })
            .await;
        assert_eq!(result.map_err(|e| e.kind()), Err(ErrorKind::Lost));
    }
}
