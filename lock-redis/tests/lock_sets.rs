//! Lock sets on one node (`try_acquire_all`, one script): a set is granted whole, with
//! tokens above every token its keys had before; refused whole, changing nothing, when one
//! key is held; a retry of the same leases answers the same tokens with the TTLs
//! restarted. With replica confirmation, a set is confirmed as a whole, and one the
//! replica does not confirm is rolled back, every key of it.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use conformance_tests::store_process::{StoreProcess, StoreSpec};
use lock_core::backend::{AcquireRequest, DynBackend};
use lock_core::{ErrorKind, Renewal};
use support::{connect, entry, lock_key, redis_url, start_redis};

use conformance_tests::requests::{fresh_keys, manual_requests, refused_with_a_held_key};

const TTL: Duration = Duration::from_secs(60);

/// Grants `set`, checks each key is held by its lease with its token, and answers the
/// tokens.
async fn granted_whole(backend: &DynBackend, set: &[AcquireRequest]) -> Vec<u64> {
    let grants = backend
        .try_acquire_all(set)
        .await
        .unwrap()
        .expect("a free set is granted");
    assert_eq!(grants.len(), set.len());
    let mut tokens = Vec::new();
    for (request, grant) in set.iter().zip(&grants) {
        let holder = backend.inspect(request.key()).await.unwrap().expect("held");
        assert_eq!(holder.lease_id, request.lease_id());
        assert_eq!(holder.token, grant.token());
        tokens.push(grant.token().get());
    }
    tokens
}

async fn release_all(backend: &DynBackend, set: &[AcquireRequest]) {
    for request in set {
        let released = backend
            .release(request.key(), request.lease_id())
            .await
            .unwrap();
        assert!(released.is_held(), "{:?} was not held", request.key());
    }
}

/// A free set is granted whole, each key to its lease; granted again after a release
/// (and after one key went to a single acquire in between), every key's token is above
/// the one it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_set_is_granted_whole_with_tokens_increasing() {
    let server = start_redis().await;
    let backend = connect(&redis_url(server.addr(), "")).await;
    let keys = fresh_keys("whole", 3);
    let first_set = manual_requests(&keys, TTL);
    let first = granted_whole(&backend, &first_set).await;
    assert!(
        first.windows(2).all(|pair| pair[0] <= pair[1]),
        "tokens of one set go down in key order: {first:?}"
    );
    release_all(&backend, &first_set).await;
    let single = manual_requests(&keys[1..2], TTL).remove(0);
    let between = backend.try_acquire(&single).await.unwrap().expect("free");
    assert!(between.token().get() > first[1]);
    release_all(&backend, std::slice::from_ref(&single)).await;
    let second = granted_whole(&backend, &manual_requests(&keys, TTL)).await;
    for (n, (before, after)) in first.iter().zip(&second).enumerate() {
        assert!(after > before, "key {n}: token {after} after {before}");
    }
    assert!(second[1] > between.token().get());
}

/// One key held by another lease: the set is refused and none of its other keys is held;
/// the holder keeps its key, and once it is free the same set is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_held_key_is_refused_whole() {
    let server = start_redis().await;
    let backend = connect(&redis_url(server.addr(), "")).await;
    let keys = fresh_keys("refused", 3);
    let (set, other) = refused_with_a_held_key(backend.as_ref(), &keys, TTL).await;
    release_all(&backend, std::slice::from_ref(&other)).await;
    granted_whole(&backend, &set).await;
}

/// One key twice in a set, for two leases: the second could never be granted, so the set
/// is refused, changing nothing (never the first lease overwritten by the second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_naming_a_key_for_two_leases_is_refused() {
    let server = start_redis().await;
    let backend = connect(&redis_url(server.addr(), "")).await;
    let keys = fresh_keys("twice", 2);
    let set = manual_requests(&[keys[0].clone(), keys[1].clone(), keys[1].clone()], TTL);
    assert!(backend.try_acquire_all(&set).await.unwrap().is_none());
    for key in &keys {
        assert_eq!(backend.inspect(key).await.unwrap(), None);
    }
}

/// A retry of a granted set (same lease ids, its reply lost) answers the same tokens and
/// restarts the TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_the_same_leases_gets_the_same_tokens() {
    let server = start_redis().await;
    let backend = connect(&redis_url(server.addr(), "")).await;
    let keys = fresh_keys("retry", 3);
    let short = manual_requests(&keys, Duration::from_secs(5));
    let first = granted_whole(&backend, &short).await;
    let retry: Vec<AcquireRequest> = short
        .iter()
        .map(|request| {
            AcquireRequest::new(request.key().clone(), TTL, Duration::ZERO, Renewal::Manual)
                .with_lease_id(request.lease_id())
        })
        .collect();
    assert_eq!(granted_whole(&backend, &retry).await, first);
    for request in &retry {
        let holder = backend.inspect(request.key()).await.unwrap().expect("held");
        assert!(
            holder.remaining_ttl > Duration::from_secs(5),
            "the retry did not restart the TTL: {:?} left",
            holder.remaining_ttl
        );
    }
}

/// How long the replicated tests let a replica take to confirm.
const REPLICA_TIMEOUT: Duration = Duration::from_millis(100);

/// A primary and one replica whose link is up, and a backend that has every grant
/// confirmed by one replica.
async fn confirmed() -> (StoreProcess, StoreProcess, DynBackend) {
    let primary = start_redis().await;
    let replica = StoreProcess::start(StoreSpec::redis_replica_of(primary.port()))
        .await
        .unwrap_or_else(|err| panic!("cannot start the replica: {err}"));
    let url = redis_url(
        primary.addr(),
        &format!(
            "replicas=1&replica_timeout_ms={}",
            REPLICA_TIMEOUT.as_millis()
        ),
    );
    let backend = connect(&url).await;
    (primary, replica, backend)
}

/// With `replicas=1`, the replica already has every key of a set when it is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_set_is_on_the_replica_when_granted() {
    let (primary, replica, backend) = confirmed().await;
    let keys = fresh_keys("confirmed", 3);
    let set = manual_requests(&keys, TTL);
    granted_whole(&backend, &set).await;
    for key in &keys {
        let stored = lock_key("distlock:", key.as_str());
        let on_replica = entry(replica.addr(), &stored).await;
        assert!(on_replica.is_some(), "the replica does not have {key:?}");
        assert_eq!(on_replica, entry(primary.addr(), &stored).await);
    }
    release_all(&backend, &set).await;
}

/// With the replica frozen, a set fails as `Unavailable` and every key of it is free on
/// the primary again: the unconfirmed grant is rolled back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_set_is_rolled_back_whole() {
    let (primary, replica, backend) = confirmed().await;
    let keys = fresh_keys("frozen", 3);
    replica.pause().unwrap();
    let err = backend
        .try_acquire_all(&manual_requests(&keys, TTL))
        .await
        .unwrap_err();
    replica.resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    for key in &keys {
        assert_eq!(
            entry(primary.addr(), &lock_key("distlock:", key.as_str())).await,
            None,
            "the unconfirmed grant of {key:?} is still on the primary"
        );
        assert!(backend.inspect(key).await.unwrap().is_none());
    }
}
