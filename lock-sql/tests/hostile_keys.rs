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
