//! Requests for backend crates' own tests of the store operations, made the same way in
//! every crate.

use std::time::Duration;

use lock_core::backend::{AcquireRequest, LockBackend};
use lock_core::{LeaseId, LockKey, Renewal};

/// `count` fresh mutex keys named after `name`, unique to this call, in key order.
pub fn fresh_keys(name: &str, count: usize) -> Vec<LockKey> {
    let run = LeaseId::random();
    (0..count)
        .map(|n| {
            LockKey::new(format!("{name}/{run}/{n}"))
                .unwrap_or_else(|err| panic!("a test key of {name:?}: {err}"))
        })
        .collect()
}

/// One request per key of `keys` for `ttl`, each with a lease of its own, renewed by hand
/// (nothing renews them behind the test's back) and no drift allowance.
pub fn manual_requests(keys: &[LockKey], ttl: Duration) -> Vec<AcquireRequest> {
    keys.iter()
        .map(|key| AcquireRequest::new(key.clone(), ttl, Duration::ZERO, Renewal::Manual))
        .collect()
}

/// Holds the middle key of three under a lease of its own, then asks `backend` for the
/// whole set of `keys` and checks it is refused having changed nothing: the other keys
/// free, the held key still its holder's, with its token. Answers the set and the held
/// key's request, for the caller to go on with (release, grant the set again). Panics on
/// a broken store, as a test does.
pub async fn refused_with_a_held_key(
    backend: &dyn LockBackend,
    keys: &[LockKey],
    ttl: Duration,
) -> (Vec<AcquireRequest>, AcquireRequest) {
    assert_eq!(keys.len(), 3, "three keys, the middle one held");
    let other = manual_requests(&keys[1..2], ttl).remove(0);
    let held = backend
        .try_acquire(&other)
        .await
        .expect("the store answers")
        .expect("a free key");
    let set = manual_requests(keys, ttl);
    assert!(
        backend
            .try_acquire_all(&set)
            .await
            .expect("the store answers")
            .is_none(),
        "a set with a held key was granted"
    );
    for key in [&keys[0], &keys[2]] {
        assert_eq!(
            backend.inspect(key).await.expect("the store answers"),
            None,
            "{key:?} is held after the set was refused"
        );
    }
    let holder = backend
        .inspect(&keys[1])
        .await
        .expect("the store answers")
        .expect("still held");
    assert_eq!(
        (holder.lease_id, holder.token),
        (other.lease_id(), held.token())
    );
    (set, other)
}
