//! Keys full of SQL metacharacters lock and release correctly on every dialect and touch
//! no other row: a bystander lock and a bystander key that is a LIKE-pattern match of
//! the hostile ones survive, and each hostile key is seen under its exact name.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lock_core::backend::LockBackend;
use lock_core::{ErrorKind, LockClient, LockKey};

mod support;
use support::Database;

const HOSTILE: &[&str] = &[
    "'",
    "''",
    "\"",
    "`",
    "';--",
    "'; DROP TABLE distlock_locks; --",
    "--",
    "/*",
    "*/",
    ";",
    "%",
    "_",
    "a%",
    "a_",
    "\\",
    "\\\\",
    "\\'",
    "\\%",
    "\\_",
    "$1",
    "?",
    "?1",
    ":name",
    "@x",
    "NULL",
    "0x00",
    "ключ",
    "🔒",
    "é",
    "e\u{301}",
    " ",
    "a ",
    "A",
    // The last character there is: a prefix ending in it has no successor of the same
    // length (list_held's upper bound).
    "\u{10ffff}",
];

async fn hostile_keys(db: Database) {
    let backend = db.backend().await;
    let client = LockClient::new(backend.clone()).with_defaults(lock_core::AcquireOptions {
        ttl: Duration::from_secs(60),
        ..Default::default()
    });
    let prefix = format!("hostile-{}/", std::process::id());
    // Bystanders that a LIKE pattern, a trimmed or case-folded comparison, or an
    // injected statement would hit.
    let bystanders = [
        format!("{prefix}a"),
        format!("{prefix}ab"),
        format!("{prefix}x"),
    ];
    let mut bystander_guards = Vec::new();
    for key in &bystanders {
        bystander_guards.push(client.lock(key).await.unwrap());
    }
    let mut guards = Vec::new();
    for name in HOSTILE {
        let key = format!("{prefix}{name}");
        let guard = client
            .try_lock(&key)
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        guards.push((key, guard));
    }
    let mut stored = backend.stored_keys(&prefix).await.unwrap();
    stored.sort();
    let mut expected: Vec<String> = guards
        .iter()
        .map(|(key, _)| key.clone())
        .chain(bystanders.iter().cloned())
        .collect();
    expected.sort();
    assert_eq!(stored, expected, "keys were mangled or merged");
    list_held_matches_exactly_the_prefix(&backend, &prefix, &expected, &guards).await;
    for (key, guard) in &guards {
        let info = backend
            .inspect(&LockKey::new(key.as_str()).unwrap())
            .await
            .unwrap()
            .expect("held");
        assert_eq!(info.lease_id, guard.lease().id(), "{key:?}");
        let err = client.try_lock(key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{key:?}");
    }
    for (key, guard) in guards {
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        assert!(client.inspect(&key).await.unwrap().is_none(), "{key:?}");
    }
    // Only the bystanders are left, still held by their own leases.
    let mut left = backend.stored_keys(&prefix).await.unwrap();
    left.sort();
    assert_eq!(left, bystanders.to_vec());
    for guard in bystander_guards {
        assert!(guard.is_held());
        guard.release().await.unwrap();
    }
    assert!(backend.stored_keys(&prefix).await.unwrap().is_empty());
}

/// `list_held` under the namespace shows every key (`held`, sorted) in Rust's order, and
/// under each hostile key as a prefix exactly the keys that start with it: no LIKE
/// wildcard, case folding or collation widens or reorders the match.
async fn list_held_matches_exactly_the_prefix(
    backend: &lock_sql::SqlBackend,
    prefix: &str,
    held: &[String],
    guards: &[(String, lock_core::LockGuard)],
) {
    let listed = backend.list_held(prefix, 1000).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, held, "list_held under the namespace");
    for (key, guard) in guards {
        let info = &listed[held.iter().position(|k| k == key).unwrap()].1;
        assert_eq!(info.lease_id, guard.lease().id(), "{key:?}");
    }
    let first: Vec<String> = backend
        .list_held(prefix, 3)
        .await
        .unwrap()
        .into_iter()
        .map(|(key, _)| key.as_str().to_owned())
        .collect();
    assert_eq!(first, held[..3], "list_held with a limit of 3");
    let extra = [
        format!("{prefix}a"),
        format!("{prefix}\\"),
        prefix[..prefix.len() - 1].to_owned(),
    ];
    let narrower = guards.iter().map(|(key, _)| key).chain(&extra);
    for sub in narrower {
        let listed: Vec<String> = backend
            .list_held(sub, 1000)
            .await
            .unwrap()
            .into_iter()
            .map(|(key, _)| key.as_str().to_owned())
            .collect();
        let expected: Vec<&String> = held
            .iter()
            .filter(|k| k.starts_with(sub.as_str()))
            .collect();
        assert_eq!(
            listed.iter().collect::<Vec<_>>(),
            expected,
            "list_held({sub:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    hostile_keys(Database::sqlite().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    hostile_keys(Database::postgres().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    hostile_keys(Database::mariadb().await.unwrap()).await;
}
