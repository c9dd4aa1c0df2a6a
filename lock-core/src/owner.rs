//! Reentrancy: an owner that may take a key it already holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::client::{LockClient, LockRequest};
use crate::error::{Error, ErrorKind, Result};
use crate::guard::{lock, HeldLock, LockGuard};
use crate::key::LockKey;
use crate::options::{AcquireOptions, Wait};

/// A reentrant lock owner. Clones are the same owner, so it can be shared across tasks.
///
/// Locking a key the owner already holds succeeds at once with the same lease and token,
/// and must be released as many times; only the outermost release touches the store. A
/// re-entry shares the outer lease, its TTL and its renewal; the options of the inner
/// request are not used. Locks taken directly on a [`LockClient`] are not reentrant.
///
/// One task of the owner at a time talks to the store for a key; while it does, the
/// owner's other tasks wait for its outcome within their own wait bound (a `try_lock`
/// fails at once with [`ErrorKind::HeldByAnother`]) and re-enter if it got the lock.
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

/// The owner's state for one key.
#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Signalled when an acquisition of the key by one of the owner's tasks ends, so the
    /// tasks waiting for its outcome look again.
    settled: Notify,
}

#[derive(Debug, Default)]
struct SlotState {
    held: Option<(Arc<HeldLock>, usize)>,
    /// One of the owner's tasks is talking to the store for this key. The others do not
    /// queue behind it in the store (they would wait for their own owner) but wait for its
    /// outcome, each within its own bound.
    acquiring: bool,
}

/// A task's use of a key's slot; the slot is forgotten when the last use ends with
/// nothing held, also when the task is cancelled.
#[derive(Debug)]
struct SlotUse {
    owner: LockOwner,
    key: LockKey,
    slot: Arc<Slot>,
}

impl Drop for SlotUse {
    fn drop(&mut self) {
        let mut slots = lock(&self.owner.inner.slots);
        let idle = {
            let state = lock(&self.slot.state);
            state.held.is_none() && !state.acquiring
        };
        // The map's reference and this one: no other task uses the slot.
        if idle
            && Arc::strong_count(&self.slot) <= 2
            && slots
                .get(&self.key)
                .is_some_and(|current| Arc::ptr_eq(current, &self.slot))
        {
            slots.remove(&self.key);
        }
    }
}

/// The turn of the task that talks to the store; ending it (also by cancellation) lets
/// the owner's waiting tasks look again.
struct AcquiringTurn<'a>(&'a Slot);

impl Drop for AcquiringTurn<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).acquiring = false;
        self.0.settled.notify_waiters();
    }
}

/// A guard's link to its owner's entry count.
#[derive(Debug)]
pub(crate) struct Reentry {
    slot_use: SlotUse,
}

impl Reentry {
    /// Counts one release; `true` when it was the outermost and the store must be told.
    pub(crate) fn leave(self, held: &Arc<HeldLock>) -> bool {
        let mut state = lock(&self.slot_use.slot.state);
        match state.held.as_mut() {
            Some((current, count)) if Arc::ptr_eq(current, held) => {
                *count -= 1;
                if *count == 0 {
                    state.held = None;
                    true
                } else {
                    false
                }
            }
            // The lock was lost and replaced by a newer acquisition: this old one is not
            // counted any more.
            _ => true,
        }
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
        slot.and_then(|slot| lock(&slot.state).held.as_ref().map(|(_, count)| *count))
            .unwrap_or(0)
    }

    /// How many keys the owner keeps state for (held, or being acquired).
    #[cfg(test)]
    fn tracked_keys(&self) -> usize {
        lock(&self.inner.slots).len()
    }

    pub(crate) async fn acquire(
        &self,
        key: LockKey,
        mut options: AcquireOptions,
    ) -> Result<LockGuard> {
        if !self.inner.client.backend().capabilities().reentrancy {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "backend {} does not support reentrant owners",
                    self.inner.client.backend().name()
                ),
            ));
        }
        let until = options.wait.deadline_from(Instant::now());
        let slot = Arc::clone(lock(&self.inner.slots).entry(key.clone()).or_default());
        let slot_use = SlotUse {
            owner: self.clone(),
            key: key.clone(),
            slot,
        };
        let slot = Arc::clone(&slot_use.slot);
        loop {
            let settled = {
                let mut state = lock(&slot.state);
                if let Some((held, count)) = state.held.as_mut() {
                    if held.is_held() {
                        *count += 1;
                        let held = Arc::clone(held);
                        drop(state);
                        return Ok(LockGuard::new(held, Some(Reentry { slot_use })));
                    }
                }
                if !state.acquiring {
                    state.acquiring = true;
                    break;
                }
                // Made while the state is locked, so the acquirer's signal cannot slip
                // between this look and the wait.
                slot.settled.notified()
            };
            match until {
                _ if options.wait == Wait::No => {
                    return Err(Error::new(
                        ErrorKind::HeldByAnother,
                        format!(
                            "{:?} is being acquired by another task of this owner",
                            key.as_str()
                        ),
                    ))
                }
                None => settled.await,
                Some(until) => {
                    let until = tokio::time::Instant::from_std(until);
                    if tokio::time::timeout_at(until, settled).await.is_err() {
                        return Err(Error::new(
                            ErrorKind::TimedOut,
                            format!(
                                "{:?} stayed held for the whole wait (another task of this \
                                 owner was acquiring it)",
                                key.as_str()
                            ),
                        ));
                    }
                }
            }
        }
        let turn = AcquiringTurn(&slot);
        if let (Some(until), Wait::UpTo(_)) = (until, options.wait) {
            // Time spent waiting for the owner's other task counts against the bound.
            options.wait = Wait::UpTo(until.saturating_duration_since(Instant::now()));
        }
        let mut guard = self.inner.client.acquire_guard(key, options).await?;
        lock(&slot.state).held = Some((Arc::clone(guard.shared()), 1));
        drop(turn);
        guard.set_reentry(Reentry { slot_use });
        Ok(guard)
    }
}

#[cfg(test)]
mod tests {
    use std::future::IntoFuture;
    use std::time::Duration;

    use super::*;
    use crate::MemoryBackend;

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
        let deadline = Instant::now() + Duration::from_secs(5);
        while !owner
            .inner
            .slots
            .lock()
            .unwrap()
            .get(&LockKey::new("k").unwrap())
            .is_some_and(|s| lock(&s.state).acquiring)
        {
            assert!(Instant::now() < deadline, "the waiter never started");
            tokio::task::yield_now().await;
        }
        let started = Instant::now();
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
        assert_eq!(owner.tracked_keys(), 0);
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
        assert_eq!(owner.tracked_keys(), 0);
        for guard in held {
            guard.release().await.unwrap();
        }
    }
}
