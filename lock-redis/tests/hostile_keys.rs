//! Keys with Lua and glob metacharacters, hash-tag braces, spaces and unicode: each is its
//! own lock, and the Redis keys written for them keep one hex hash tag per lock.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use lock_core::backend::{default_drift_allowance, AcquireRequest, LockBackendExt};
use lock_core::LockKey;
use lock_core::Renewal;
use support::{redis_url, start_redis};

const HOSTILE: &[&str] = &[
    "*",
    "a*",
    "?",
    "[a-z]",
    "[",
    "]",
    "\\*",
    "{",
    "}",
    "{tag}",
    "}{",
    "x{tag}y",
    "{}",
    "{a}{b}",
    "with space",
    " leading and trailing ",
    "ünïcødé 🔒",
    "日本語",
    "redis.call('FLUSHALL')",
    "--[[ lua ]]",
    "]] .. os.exit() .. [[",
    "%s%d%%",
    "'\"`",
    ":fence",
    "x}:fence",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_are_distinct_locks_with_safe_redis_keys() {
    let server = start_redis().await;
    let url = redis_url(server.addr(), "key_prefix=hk:");
    let backend = support::connect(&url).await;
    let prefix = format!("hostile-{:08x}/", fastrand::u32(..));
    let ttl = Duration::from_secs(30);
    let mut leases = Vec::new();
    for name in HOSTILE {
        let key = LockKey::new(format!("{prefix}{name}")).unwrap();
        let request = AcquireRequest::new(key, ttl, default_drift_allowance(ttl), Renewal::Manual);
        let lease = backend.acquire_once(&request, ttl).await.unwrap();
        leases.push(lease);
    }
    // Bare names without the prefix are yet other keys, still free.
    for name in HOSTILE {
        let key = LockKey::new(*name).unwrap();
        assert!(backend.inspect(&key).await.unwrap().is_none(), "{name:?}");
    }
    let mut stored = support::stored_keys(&url, &prefix).await.unwrap();
    let mut expected: Vec<String> = HOSTILE.iter().map(|n| format!("{prefix}{n}")).collect();
    stored.sort();
    expected.sort();
    assert_eq!(stored, expected);

    // list_held decodes every key as it was locked, in order, and a hostile key used as
    // a prefix (glob characters, braces, backslashes) matches exactly the keys that
    // start with it.
    let listed = backend.list_held(&prefix, 1000).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, expected, "list_held under the namespace");
    for lease in &leases {
        let (_, info) = listed.iter().find(|(key, _)| key == lease.key()).unwrap();
        assert_eq!(info.lease_id, lease.id(), "{:?}", lease.key());
    }
    let first = backend.list_held(&prefix, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[1].0.as_str(), expected[1]);
    for name in HOSTILE.iter().chain(&["", "\\", "x{", "]]"]) {
        let sub = format!("{prefix}{name}");
        let listed: Vec<String> = backend
            .list_held(&sub, 1000)
            .await
            .unwrap()
            .into_iter()
            .map(|(key, _)| key.as_str().to_owned())
            .collect();
        let matching: Vec<String> = expected
            .iter()
            .filter(|key| key.starts_with(&sub))
            .cloned()
            .collect();
        assert_eq!(listed, matching, "list_held({sub:?})");
    }

    // Every Redis key has exactly one hash tag, all hex, shared by a lock and its counter.
    let client = redis::Client::open(format!("redis://{}/0", server.addr())).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys.len(), HOSTILE.len() * 2, "{keys:?}");
    let mut tags = HashSet::new();
    for key in &keys {
        let rest = key.strip_prefix("hk:{").unwrap_or_else(|| panic!("{key}"));
        let (tag, tail) = rest.split_once('}').unwrap();
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
        assert!(tail.is_empty() || tail == ":fence", "{key}");
        tags.insert(tag.to_string());
    }
    assert_eq!(tags.len(), HOSTILE.len());
    // Each counter holds its own key's only token: no two keys share one.
    for lease in &leases {
        let hex: String = lease
            .key()
            .as_str()
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        let counter: u64 = redis::cmd("GET")
            .arg(format!("hk:{{{hex}}}:fence"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(
            counter,
            lease.token().get(),
            "{:?} shares a counter",
            lease.key()
        );
    }

    // Releasing one leaves every other held.
    let (first, rest) = leases.split_first().unwrap();
    assert!(backend
        .release(first.key(), first.id())
        .await
        .unwrap()
        .is_held());
    for lease in rest {
        let info = backend.inspect(lease.key()).await.unwrap().unwrap();
        assert_eq!(info.lease_id, lease.id(), "{:?}", lease.key());
    }
    for lease in rest {
        assert!(backend
            .release(lease.key(), lease.id())
            .await
            .unwrap()
            .is_held());
    }
    assert!(support::stored_keys(&url, &prefix)
        .await
        .unwrap()
        .is_empty());
}
