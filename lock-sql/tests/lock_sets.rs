//! Lock sets on every dialect: `try_acquire_all` grants a whole set in one transaction
//! (tokens increasing in key order), refuses it whole when one key is held (the other
//! keys stay free), answers a retry of the same leases with the same tokens (their TTLs
//! restarted), and two overlapping sets taken over and over at once never meet a
//! database deadlock.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::backend::{AcquireRequest, LockBackend};
use lock_core::{LockKey, Renewal};
use lock_sql::SqlBackend;

mod raw_connection;
mod support;
use raw_connection::RawConnection;
use support::Database;

use conformance_tests::requests::{fresh_keys, manual_requests, refused_with_a_held_key};

const TTL: Duration = Duration::from_secs(60);

/// A free set is granted whole: each key held by its own lease with the granted token,
/// tokens increasing in key order and above every token granted before.
async fn a_free_set_is_granted_whole(db: Database) {
    let backend = db.backend().await;
    let before = fresh_keys("before", 1);
    let earlier = backend
        .try_acquire(&manual_requests(&before, TTL)[0])
        .await
        .unwrap()
        .expect("a free key");
    let keys = fresh_keys("whole", 3);
    let set = manual_requests(&keys, TTL);
    let grants = backend
        .try_acquire_all(&set)
        .await
        .unwrap()
        .expect("a free set is granted");
    assert_eq!(grants.len(), set.len());
    let mut last = earlier.token();
    for (request, grant) in set.iter().zip(&grants) {
        assert!(grant.token() > last, "token {} after {last}", grant.token());
        last = grant.token();
        let holder = backend.inspect(request.key()).await.unwrap().expect("held");
        assert_eq!(holder.lease_id, request.lease_id());
        assert_eq!(holder.token, grant.token());
    }
}

/// One key held by another lease: the set is refused and none of its other keys is held
/// (the keys before the held one in key order, and after it); the holder keeps its key.
async fn a_set_with_a_held_key_is_refused_whole(db: Database) {
    let backend = db.backend().await;
    let keys = fresh_keys("refused", 3);
    let (set, other) = refused_with_a_held_key(&backend, &keys, TTL).await;
    // Free again, the same set (same leases) is granted.
    assert!(backend
        .release(&keys[1], other.lease_id())
        .await
        .unwrap()
        .is_held());
    assert!(backend.try_acquire_all(&set).await.unwrap().is_some());
}

/// A retry of a granted set (same lease ids, its reply lost) answers the same tokens and
/// restarts the TTLs.
async fn a_retry_of_the_same_leases_gets_the_same_tokens(db: Database) {
    let backend = db.backend().await;
    let keys = fresh_keys("retry", 3);
    let short = manual_requests(&keys, Duration::from_secs(5));
    let first = backend
        .try_acquire_all(&short)
        .await
        .unwrap()
        .expect("a free set");
    let retry: Vec<AcquireRequest> = short
        .iter()
        .map(|request| {
            AcquireRequest::new(request.key().clone(), TTL, Duration::ZERO, Renewal::Manual)
                .with_lease_id(request.lease_id())
        })
        .collect();
    let again = backend
        .try_acquire_all(&retry)
        .await
        .unwrap()
        .expect("a retry of the holders is granted");
    for ((request, first), again) in retry.iter().zip(&first).zip(&again) {
        assert_eq!(first.token(), again.token(), "{:?}", request.key());
        let holder = backend.inspect(request.key()).await.unwrap().expect("held");
        assert_eq!(holder.lease_id, request.lease_id());
        assert!(
            holder.remaining_ttl > Duration::from_secs(5),
            "the retry did not restart the TTL: {:?} left",
            holder.remaining_ttl
        );
    }
}

/// Two clients take overlapping sets (one of them listing its keys in reverse) over and
/// over at once, each waiting for its set by retrying: every attempt is answered (no
/// deadlock error), the two never hold at once, and both finish every round.
///
/// PostgreSQL looks for a deadlock only after `deadlock_timeout` (1 s by default), as
/// long as the acquire statement's own lock wait: lowered here, so that a cycle of lock
/// waits is reported as one (40P01) rather than ending as a lock wait time-out, which
/// reads as contention.
async fn overlapping_sets_at_once_never_deadlock(db: Database) {
    const ROUNDS: usize = 25;
    if db.name == "postgres" {
        RawConnection::open(&db)
            .await
            .run("ALTER ROLE CURRENT_USER SET deadlock_timeout = '20ms'")
            .await;
    }
    let keys = fresh_keys("overlap", 4);
    let ours: Vec<LockKey> = keys[..3].to_vec();
    let theirs: Vec<LockKey> = keys[1..].iter().rev().cloned().collect();
    let holding = Arc::new(AtomicBool::new(false));
    let run = |backend: SqlBackend, keys: Vec<LockKey>| {
        let holding = Arc::clone(&holding);
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            for _ in 0..ROUNDS {
                let set = manual_requests(&keys, TTL);
                loop {
                    match backend.try_acquire_all(&set).await {
                        Ok(Some(_)) => break,
                        Ok(None) => {
                            assert!(Instant::now() < deadline, "the set never came free");
                            tokio::task::yield_now().await;
                        }
                        Err(err) => panic!("a lock set attempt failed: {err}"),
                    }
                }
                assert!(
                    !holding.swap(true, Ordering::SeqCst),
                    "two overlapping sets held at once"
                );
                tokio::task::yield_now().await;
                holding.store(false, Ordering::SeqCst);
                for request in &set {
                    let released = backend
                        .release(request.key(), request.lease_id())
                        .await
                        .unwrap();
                    assert!(released.is_held(), "{:?} was not held", request.key());
                }
            }
        }
    };
    let (one, two) = (db.backend().await, db.backend().await);
    let (a, b) = tokio::join!(tokio::spawn(run(one, ours)), tokio::spawn(run(two, theirs)));
    a.unwrap();
    b.unwrap();
}

/// One test per scenario in a module per database.
macro_rules! on_database {
    ($($database:ident),+ $(,)?) => {$(
        mod $database {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_free_set_is_granted_whole() {
                super::a_free_set_is_granted_whole(Database::$database().await.unwrap()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_set_with_a_held_key_is_refused_whole() {
                super::a_set_with_a_held_key_is_refused_whole(
                    Database::$database().await.unwrap(),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_retry_of_the_same_leases_gets_the_same_tokens() {
                super::a_retry_of_the_same_leases_gets_the_same_tokens(
                    Database::$database().await.unwrap(),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn overlapping_sets_at_once_never_deadlock() {
                super::overlapping_sets_at_once_never_deadlock(
                    Database::$database().await.unwrap(),
                )
                .await;
            }
        }
    )+};
}

on_database!(sqlite, postgres, mariadb);
