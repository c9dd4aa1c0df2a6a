//! Reentrancy: an owner that may take a key it already holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::client::{LockClient, LockRequest};
use crate::error::{Error, ErrorKind, Result};
use crate::guard::{lock, HeldLock, LockGuard};
use crate::key::LockKey;
use crate::options::AcquireOptions;

/// A reentrant lock owner. Clones are the same owner, so it can be shared across tasks.
///
/// Locking a key the owner already holds succeeds at once with the same lease and token,
/// and must be released as many times; only the outermost release touches the store. A
/// re-entry shares the outer lease, its TTL and its renewal; the options of the inner
/// request are not used. Locks taken directly on a [`LockClient`] are not reentrant.
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
/// assert!(inner.release().await?); // still held by `outer`
/// assert_eq!(owner.holds("job"), 1);
/// assert!(outer.release().await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockOwner {
    inner: Arc<OwnerInner>,
}

#[derive(Debug)]
struct OwnerInner {
    client: LockClient,
    slots: Mutex<HashMap<LockKey, Arc<Slot>>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Serialises this owner's acquisitions of the key, so a second task of the same owner
    /// re-enters the lock the first one is taking instead of queueing behind it.
    acquiring: tokio::sync::Mutex<()>,
    held: Mutex<Option<(Arc<HeldLock>, usize)>>,
}

/// A guard's link to its owner's entry count.
#[derive(Debug)]
pub(crate) struct Reentry {
    owner: LockOwner,
    key: LockKey,
    slot: Arc<Slot>,
}

impl Reentry {
    /// Counts one release; `true` when it was the outermost and the store must be told.
    pub(crate) fn leave(self, held: &Arc<HeldLock>) -> bool {
        let outermost = {
            let mut entry = lock(&self.slot.held);
            match entry.as_mut() {
                Some((current, count)) if Arc::ptr_eq(current, held) => {
                    *count -= 1;
                    if *count == 0 {
                        *entry = None;
                        true
                    } else {
                        false
                    }
                }
                // The lock was lost and replaced by a newer acquisition: this old one is
                // not counted any more.
                _ => true,
            }
        };
        self.owner.forget_idle(&self.key, &self.slot);
        outermost
    }
}

impl LockOwner {
    pub(crate) fn new(client: LockClient) -> Self {
        LockOwner {
            inner: Arc::new(OwnerInner {
                client,
                slots: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A request for `key` on behalf of this owner, to refine and `.await`.
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        LockRequest::for_owner(self, &self.inner.client, LockKey::new(key))
    }

    /// A request that does not wait for a key held by someone else.
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        self.lock(key).no_wait()
    }

    /// How many unreleased entries this owner has on `key` (0 when it does not hold it).
    pub fn holds(&self, key: impl AsRef<str>) -> usize {
        let Ok(key) = LockKey::new(key) else { return 0 };
        let slot = lock(&self.inner.slots).get(&key).cloned();
        slot.and_then(|slot| lock(&slot.held).as_ref().map(|(_, count)| *count))
            .unwrap_or(0)
    }

    pub(crate) async fn acquire(&self, key: LockKey, options: AcquireOptions) -> Result<LockGuard> {
        if !self.inner.client.backend().capabilities().reentrancy {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "backend {} does not support reentrant owners",
                    self.inner.client.backend().name()
                ),
            ));
        }
        let slot = Arc::clone(lock(&self.inner.slots).entry(key.clone()).or_default());
        let _turn = slot.acquiring.lock().await;
        let reentry = Reentry {
            owner: self.clone(),
            key: key.clone(),
            slot: Arc::clone(&slot),
        };
        {
            let mut entry = lock(&slot.held);
            if let Some((held, count)) = entry.as_mut() {
                if held.is_held() {
                    *count += 1;
                    return Ok(LockGuard::new(Arc::clone(held), Some(reentry)));
                }
            }
        }
        match self.inner.client.acquire_guard(key.clone(), options).await {
            Ok(mut guard) => {
                *lock(&slot.held) = Some((Arc::clone(guard.shared()), 1));
                guard.set_reentry(reentry);
                Ok(guard)
            }
            Err(err) => {
                drop(_turn);
                drop(reentry);
                self.forget_idle(&key, &slot);
                Err(err)
            }
        }
    }

    /// Drops the key's slot when nothing holds or uses it, so keys do not accumulate.
    fn forget_idle(&self, key: &LockKey, slot: &Arc<Slot>) {
        let mut slots = lock(&self.inner.slots);
        let idle = lock(&slot.held).is_none() && Arc::strong_count(slot) <= 2;
        if idle
            && slots
                .get(key)
                .is_some_and(|current| Arc::ptr_eq(current, slot))
        {
            slots.remove(key);
        }
    }
}
