//! What the conformance scenario `hostile_keys_stay_in_their_namespace` cannot see through
//! the backend: the Redis keys the scripts write for hostile keys (support's
//! `HOSTILE_KEYS`) each carry exactly one hash tag, all hex, shared by a lock and its
//! counter (so both land in one cluster slot), and no two keys share a counter.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use lock_core::backend::{default_drift_allowance, AcquireRequest, LockBackendExt};
use lock_core::{LockKey, Renewal};
use support::{lock_key, raw, redis_url, start_redis, HOSTILE_KEYS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_get_one_hex_hash_tag_and_a_counter_of_their_own() {
    let server = start_redis().await;
    let backend = support::connect(&redis_url(server.addr(), "key_prefix=hk:")).await;
    let ttl = Duration::from_secs(30);
    let mut leases = Vec::new();
    for name in HOSTILE_KEYS {
        let key = LockKey::new(*name).unwrap();
        let request = AcquireRequest::new(key, ttl, default_drift_allowance(ttl), Renewal::Manual);
        leases.push(backend.acquire_once(&request, ttl).await.unwrap());
    }
    let mut raw = raw(server.addr()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys.len(), HOSTILE_KEYS.len() * 2, "{keys:?}");
    let mut tags = HashSet::new();
    for key in &keys {
        let rest = key.strip_prefix("hk:{").unwrap_or_else(|| panic!("{key}"));
        let (tag, tail) = rest.split_once('}').unwrap();
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
        assert!(tail.is_empty() || tail == ":fence", "{key}");
        tags.insert(tag.to_string());
    }
    assert_eq!(tags.len(), HOSTILE_KEYS.len());
    for lease in &leases {
        let counter: u64 = redis::cmd("GET")
            .arg(format!("{}:fence", lock_key("hk:", lease.key().as_str())))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(counter, lease.token().get(), "{:?}", lease.key());
    }
}
