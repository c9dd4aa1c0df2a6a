//! Requests for backend crates' own tests of the store operations, made the same way in
//! every crate.

use std::time::Duration;

use lock_core::backend::AcquireRequest;
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
