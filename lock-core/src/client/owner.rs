//! Reentrancy for users: an owner that may take a key it already holds.

use std::sync::Arc;

use crate::client::request::LockRequest;
use crate::engine::reentry::OwnerState;
use crate::engine::ClientCore;
use crate::values::key::{HoldKind, LockKey};
use crate::values::options::AcquireOptions;

/// A reentrant lock owner. Clones are the same owner, so it can be shared across tasks.
///
/// Locking a key the owner already holds succeeds at once with the same lease and token,
/// and must be released as many times; only the outermost release touches the store. A
/// re-entry shares the outer lease, its TTL and its renewal; the options of the inner
/// request are not used. Locks taken directly on a [`LockClient`](crate::LockClient) are
/// not reentrant.
///
/// One task of the owner at a time talks to the store for a key; while it does, the
/// owner's other tasks wait for its outcome within their own wait bound (a `try_lock`
/// fails at once with [`ErrorKind::HeldByAnother`](crate::ErrorKind)) and re-enter if it
/// got the lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use lock_core::{LockClient, MemoryBackend};
///
/// let owner = LockClient::new(MemoryBackend::new()).owner();
/// let outer = owner.lock("job").await?;
/// let inner = owner.lock("job").await?;
/// assert_eq!(outer.token(), inner.token());
/// inner.release().await?; // still held by `outer`
/// assert_eq!(owner.holds("job"), 1);
/// outer.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockOwner {
    core: Arc<ClientCore>,
    defaults: AcquireOptions,
    state: Arc<OwnerState>,
}

impl LockOwner {
    pub(crate) fn new(core: Arc<ClientCore>, defaults: AcquireOptions) -> Self {
        LockOwner {
            core,
            defaults,
            state: Arc::default(),
        }
    }

    /// A request for `key` on behalf of this owner, to refine and `.await`.
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest {
        LockRequest::new(
            Arc::clone(&self.core),
            Some(Arc::clone(&self.state)),
            LockKey::new(key),
            self.defaults.clone(),
        )
    }

    /// A request that does not wait for a key held by someone else.
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.lock(key).no_wait()
    }

    /// A request for one permit of the semaphore `key` of `permits` permits
    /// ([`LockClient::semaphore`](crate::LockClient::semaphore)) on behalf of this owner,
    /// who re-enters a permit it holds.
    pub fn semaphore(&self, key: impl AsRef<str>, permits: u32) -> LockRequest {
        self.held_as(key, HoldKind::Permit { limit: permits })
    }

    /// A request for the read side of the reader-writer lock `key` on behalf of this
    /// owner. An owner that holds the write lock gets it at once, sharing its write hold
    /// (a downgrade: release both guards to give the lock back).
    pub fn read_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.held_as(key, HoldKind::Read)
    }

    /// A request for the write side of the reader-writer lock `key` on behalf of this
    /// owner. An owner that holds only the read lock is refused at once with
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind): an upgrade would wait for its own
    /// read hold for ever.
    pub fn write_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.held_as(key, HoldKind::Write)
    }

    fn held_as(&self, key: impl AsRef<str>, kind: HoldKind) -> LockRequest {
        LockRequest::new(
            Arc::clone(&self.core),
            Some(Arc::clone(&self.state)),
            LockKey::new(key).and_then(|key| key.held_as(kind)),
            self.defaults.clone(),
        )
    }

    /// How many unreleased entries this owner has on `key` (0 when it does not hold it).
    pub fn holds(&self, key: impl AsRef<str>) -> usize {
        LockKey::new(key).map_or(0, |key| self.state.holds(&key))
    }
}

#[cfg(test)]
mod tests {
    use std::future::IntoFuture;
    use std::time::Duration;

    use super::*;
    use crate::{ErrorKind, LockClient, MemoryBackend};

    /// While one task of the owner waits for a key held elsewhere, another task's
    /// `try_lock` fails at once and a bounded wait keeps its bound.
    #[tokio::test]
    async fn a_waiting_task_does_not_block_the_owners_other_tasks() {
        let store = MemoryBackend::new();
        let rival = LockClient::new(store.clone());
        let owner = LockClient::new(store).owner();
        let held = rival.lock("k").await.unwrap();
        let waiting = tokio::spawn({
            let owner = owner.clone();
            async move { owner.lock("k").await }
        });
        // The waiter has started talking to the store once the slot is marked.
        let deadline = crate::values::clock::now() + Duration::from_secs(5);
        while !owner.state.is_acquiring(&LockKey::new("k").unwrap()) {
            assert!(
                crate::values::clock::now() < deadline,
                "the waiter never started"
            );
            tokio::task::yield_now().await;
        }
        let started = crate::values::clock::now();
        let err = tokio::time::timeout(Duration::from_secs(2), owner.try_lock("k").into_future())
            .await
            .expect("try_lock blocked behind the owner's waiting task")
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::HeldByAnother);
        let err = tokio::time::timeout(
            Duration::from_secs(2),
            owner
                .lock("k")
                .wait_up_to(Duration::from_millis(100))
                .into_future(),
        )
        .await
        .expect("a bounded wait ignored its bound")
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(1));
        held.release().await.unwrap();
        let guard = waiting.await.unwrap().unwrap();
        // Re-entry by the task that waited behind nobody.
        let again = owner.try_lock("k").await.unwrap();
        assert_eq!(again.token(), guard.token());
        again.release().await.unwrap();
        guard.release().await.unwrap();
        assert_eq!(owner.state.tracked_keys(), 0);
    }

    /// Acquisitions cancelled mid-wait leave no per-key state behind.
    #[tokio::test]
    async fn cancelled_acquisitions_leave_no_slots() {
        let store = MemoryBackend::new();
        let rival = LockClient::new(store.clone());
        let owner = LockClient::new(store).owner();
        let mut held = Vec::new();
        for i in 0..50 {
            let key = format!("k{i}");
            held.push(rival.lock(&key).await.unwrap());
            let cancelled =
                tokio::time::timeout(Duration::from_millis(2), owner.lock(&key).into_future())
                    .await;
            assert!(cancelled.is_err());
        }
        assert_eq!(owner.state.tracked_keys(), 0);
        for guard in held {
            guard.release().await.unwrap();
        }
    }

    /// A lost lease's release is `Lost` at every depth of re-entry, not only the outermost.
    #[tokio::test]
    async fn every_depth_reports_a_lost_lease() {
        let owner = LockClient::new(MemoryBackend::new()).owner();
        let outer = owner
            .lock("k")
            .ttl(Duration::from_millis(50))
            .renewal(crate::Renewal::Manual)
            .await
            .unwrap();
        let inner = owner.lock("k").await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), outer.lost())
            .await
            .expect("the unrenewed lease was never lost");
        assert_eq!(inner.release().await.unwrap_err().kind(), ErrorKind::Lost);
        assert_eq!(outer.release().await.unwrap_err().kind(), ErrorKind::Lost);
    }
}
