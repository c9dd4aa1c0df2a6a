//! The acquisition and renewal engine under the user layer: how a lease is acquired
//! (polling or a fair queue), kept (one renewal engine per client), given back, and shared
//! by a reentrant owner's tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::backend::{lock_unpoisoned, DynBackend};
use crate::values::error::{Error, ErrorKind, Result};

pub(crate) mod acquire;
pub(crate) mod cleanup;
pub(crate) mod held;
pub(crate) mod local;
pub(crate) mod poll;
pub(crate) mod queue;
pub(crate) mod reentry;
pub(crate) mod renewal;
pub(crate) mod set;

/// What every clone of a client shares: the backend, the client's renewal engine, the
/// local lines its tasks wait in, and every lease it holds (for its shutdown).
#[derive(Debug)]
pub(crate) struct ClientCore {
    pub(crate) backend: DynBackend,
    pub(crate) renewals: renewal::Renewals,
    pub(crate) local: local::LocalLines,
    /// The client's held leases, weakly, and what its shutdown does with each: a guard
    /// dropped or released takes its entry out.
    holding: Mutex<HashMap<u64, (Weak<held::HeldLock>, AtShutdown)>>,
    /// `shutdown` was called: no more acquisitions.
    shut_down: AtomicBool,
}

impl ClientCore {
    pub(crate) fn new(backend: DynBackend) -> Self {
        ClientCore {
            renewals: renewal::Renewals::new(backend.clone()),
            local: local::LocalLines::default(),
            backend,
            holding: Mutex::default(),
            shut_down: AtomicBool::new(false),
        }
    }

    /// Notes a new hold. `Err` when the client was shut down meanwhile: the caller gives
    /// the lease back at once.
    pub(crate) fn hold(&self, held: &Arc<held::HeldLock>) -> Result<()> {
        lock_unpoisoned(&self.holding).insert(held.id, (Arc::downgrade(held), AtShutdown::Release));
        // After the insert: a shutdown either sees this hold or is seen here.
        self.refuse_if_shut_down()
    }

    /// The client's shutdown will leave `held` in the store to expire by its TTL instead
    /// of giving it back. `Err` when the shutdown began first: it may be giving the hold
    /// back already, and the caller ends it too.
    pub(crate) fn leave_to_expire_at_shutdown(&self, held: &held::HeldLock) -> Result<()> {
        let mut holding = lock_unpoisoned(&self.holding);
        if let Some((_, at_shutdown)) = holding.get_mut(&held.id) {
            *at_shutdown = AtShutdown::LeaveToExpire;
        }
        // Under the lock the shutdown takes its list with: either it sees the new mark, or
        // its flag is seen here.
        self.refuse_if_shut_down()
    }

    /// Whether hold `id` is to be left to expire rather than given back (a once ticket's).
    pub(crate) fn left_to_expire(&self, id: u64) -> bool {
        lock_unpoisoned(&self.holding)
            .get(&id)
            .is_some_and(|(_, at_shutdown)| *at_shutdown == AtShutdown::LeaveToExpire)
    }

    /// A hold is gone (its last reference dropped).
    pub(crate) fn forget(&self, id: u64) {
        lock_unpoisoned(&self.holding).remove(&id);
    }

    /// Refuses acquisitions on a client that was shut down.
    pub(crate) fn refuse_if_shut_down(&self) -> Result<()> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the client was shut down: it acquires nothing more",
            ));
        }
        Ok(())
    }

    /// Refuses new acquisitions and gives back every lease the client holds, all at once,
    /// except those marked to be left to expire (running once tickets). The first failure
    /// to reach the store, if any; leases found lost are no failure.
    pub(crate) async fn shutdown(&self) -> Result<()> {
        self.shut_down.store(true, Ordering::SeqCst);
        let holding: Vec<Arc<held::HeldLock>> = lock_unpoisoned(&self.holding)
            .values()
            .filter(|(_, at_shutdown)| *at_shutdown == AtShutdown::Release)
            .filter_map(|(held, _)| held.upgrade())
            .collect();
        let releases = holding.iter().map(|held| held.finish());
        let mut failure = None;
        for result in futures_util::future::join_all(releases).await {
            match result {
                Err(err) if err.kind() != ErrorKind::Lost => {
                    failure.get_or_insert(err);
                }
                _ => {}
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// What a client's shutdown does with a hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtShutdown {
    /// Gives it back: the holder's work ends with the program.
    Release,
    /// Leaves it to expire by its TTL: work whose outcome nobody else may guess at (a
    /// once ticket's job) may still be running, and a release would let a rival start
    /// it again.
    LeaveToExpire,
}

/// The outcome's name for tracing spans.
pub(crate) fn outcome_name<T>(result: &crate::Result<T>) -> &'static str {
    use crate::ErrorKind;
    match result {
        Ok(_) => "ok",
        Err(err) => match err.kind() {
            ErrorKind::HeldByAnother => "held_by_another",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Lost => "lost",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Misconfigured => "misconfigured",
            _ => "internal",
        },
    }
}

#[cfg(test)]
mod tests {
    use std::future::IntoFuture;
    use std::time::Duration;

    use crate::backend::LockBackend;
    use crate::{ErrorKind, LockClient, LossReason, MemoryBackend};

    /// `max_hold` ends an automatically renewed hold at its cap (not before), says so,
    /// and frees the key for others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn max_hold_ends_a_renewed_hold_and_frees_the_key() {
        let store = MemoryBackend::new();
        let (client, rival) = (LockClient::new(store.clone()), LockClient::new(store));
        let (ttl, cap) = (Duration::from_millis(300), Duration::from_millis(900));
        let started = crate::values::clock::now();
        let guard = client.lock("k").ttl(ttl).max_hold(cap).await.unwrap();
        let first = guard.lease().sent_at();
        let waiting = tokio::spawn(
            rival
                .lock("k")
                .wait_up_to(Duration::from_secs(10))
                .into_future(),
        );
        let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("the capped hold went on");
        assert_eq!(reason, LossReason::HoldCapReached);
        assert!(
            started.elapsed() >= cap,
            "cut after {:?}",
            started.elapsed()
        );
        assert!(
            guard.lease().sent_at() > first,
            "never renewed before the cap"
        );
        let taken = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the key was not given back at the cap")
            .unwrap()
            .unwrap();
        assert_eq!(guard.release().await.unwrap_err().kind(), ErrorKind::Lost);
        taken.release().await.unwrap();
    }

    /// A lease the store no longer has is lost with that reason at the next renewal.
    #[tokio::test]
    async fn a_lease_the_store_dropped_is_lost_as_not_held() {
        let store = MemoryBackend::new();
        let client = LockClient::new(store.clone());
        let guard = client
            .lock("k")
            .ttl(Duration::from_millis(300))
            .await
            .unwrap();
        let dropped = store
            .release(guard.key(), guard.lease().id())
            .await
            .unwrap();
        assert!(dropped.is_held());
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("not lost");
        assert_eq!(reason, LossReason::NotHeld);
    }

    /// `shutdown` gives every held lease back at once (guards still alive), and refuses
    /// acquisitions afterwards; the guards answer as after a release.
    #[tokio::test]
    async fn shutdown_gives_every_lease_back() {
        let store = MemoryBackend::new();
        let (client, rival) = (
            LockClient::new(store.clone()),
            LockClient::new(store.clone()),
        );
        let owner = client.owner();
        let guards = vec![
            client.lock("a").await.unwrap(),
            client
                .lock("b")
                .ttl(Duration::from_secs(600))
                .await
                .unwrap(),
            owner.lock("c").await.unwrap(),
            owner.lock("c").await.unwrap(),
        ];
        client.shutdown().await.unwrap();
        for key in ["a", "b", "c"] {
            rival.try_lock(key).await.unwrap().release().await.unwrap();
        }
        let left = store.stored_keys("").await.unwrap();
        assert!(left.is_empty(), "{left:?}");
        for guard in guards {
            assert!(!guard.is_held());
            guard.release().await.unwrap();
        }
        let refused = client.try_lock("d").await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            owner.lock("e").await.unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
