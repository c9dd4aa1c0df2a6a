//! Holder labels are kept in the lock table on every dialect: `inspect` shows the label of
//! the lease that holds the key, a takeover replaces it (a lease without a label shows
//! none, never its predecessor's), and a table made before the column existed gets it on
//! the next connect.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::eventually;
use lock_core::backend::{AcquireRequest, LockBackend};
use lock_core::{LeaseId, LockClient, LockKey, Renewal};
use lock_sql::SqlBackend;

mod raw_connection;
mod support;
use raw_connection::RawConnection;
use support::Database;

/// Colons, spaces, quotes and non-ASCII: a label is any text.
const LABEL: &str = "host-a:4242 job \"nightly\" ü🔒";

fn key(name: &str) -> String {
    format!("{name}/{}", LeaseId::random())
}

async fn backend_for(db: &Database, table: &str) -> SqlBackend {
    SqlBackend::connect(
        lock_sql::SqlConfig::from_url(&db.url_with(&format!("table={table}"))).unwrap(),
    )
    .await
    .unwrap()
}

/// A labelled lock shows its label; an unlabelled one none.
async fn inspect_shows_the_holders_label(db: Database) {
    let client = LockClient::new(db.backend().await);
    let key = key("labelled");
    let guard = client.lock(&key).holder_label(LABEL).await.unwrap();
    let status = client.inspect(&key).await.unwrap().expect("held");
    assert_eq!(status.holder.as_deref(), Some(LABEL));
    assert_eq!(status.token, guard.token());
    guard.release().await.unwrap();
    let guard = client.lock(&key).await.unwrap();
    let status = client.inspect(&key).await.unwrap().expect("held");
    assert_eq!(status.holder, None, "an unlabelled lock shows a label");
    guard.release().await.unwrap();
}

/// The row of an expired labelled lease is taken over by a lease with another label, then
/// (expired again) by one without: each holder shows its own label only.
async fn a_takeover_replaces_the_label(db: Database) {
    let backend = db.backend().await;
    let key = LockKey::new(key("takeover")).unwrap();
    let short = Duration::from_millis(50);
    let acquire = |label: Option<&str>, ttl: Duration| {
        let request = AcquireRequest::new(key.clone(), ttl, Duration::ZERO, Renewal::Manual)
            .with_holder_label(label.map(Arc::from));
        let backend = backend.clone();
        async move {
            backend
                .try_acquire(&request)
                .await
                .unwrap()
                .expect("a free key")
        }
    };
    let expired = || async {
        eventually(
            Duration::from_secs(5),
            "the short lease expires",
            || async { Ok(backend.inspect(&key).await?.is_none()) },
        )
        .await
        .unwrap();
    };
    acquire(Some("first"), short).await;
    expired().await;
    acquire(Some(LABEL), short).await;
    let info = backend.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.holder.as_deref(), Some(LABEL));
    expired().await;
    acquire(None, Duration::from_secs(60)).await;
    let info = backend.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.holder, None, "the previous holder's label stayed");
    assert!(backend
        .release(&key, info.lease_id)
        .await
        .unwrap()
        .is_held());
}

/// A lock table made before the label column existed (the column dropped here) gets it
/// when a backend connects, and keeps its rows.
async fn an_older_table_gets_the_label_column(db: Database) {
    let table = format!("old_{:08x}", fastrand::u32(..));
    let old = backend_for(&db, &table).await;
    let key = key("older-table");
    let held = LockClient::new(old).lock(&key).await.unwrap();
    drop_holder_column(&db, &table).await;
    let client = LockClient::new(backend_for(&db, &table).await);
    let status = client
        .inspect(&key)
        .await
        .unwrap()
        .expect("the row was kept");
    assert_eq!(status.holder, None);
    assert_eq!(status.token, held.token());
    held.release().await.unwrap();
    let guard = client.lock(&key).holder_label(LABEL).await.unwrap();
    let status = client.inspect(&key).await.unwrap().expect("held");
    assert_eq!(status.holder.as_deref(), Some(LABEL));
    guard.release().await.unwrap();
    // Connecting again finds the column there.
    backend_for(&db, &table).await;
}

async fn drop_holder_column(db: &Database, table: &str) {
    let sql = format!("ALTER TABLE {table} DROP COLUMN holder");
    if db.name == "sqlite" {
        use sqlx::{Connection, Executor};
        let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
    } else {
        RawConnection::open(db).await.run(&sql).await;
    }
}

/// One test per scenario in a module per database.
macro_rules! on_database {
    ($($database:ident),+ $(,)?) => {$(
        mod $database {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn inspect_shows_the_holders_label() {
                super::inspect_shows_the_holders_label(Database::$database().await.unwrap()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_takeover_replaces_the_label() {
                super::a_takeover_replaces_the_label(Database::$database().await.unwrap()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_older_table_gets_the_label_column() {
                super::an_older_table_gets_the_label_column(Database::$database().await.unwrap())
                    .await;
            }
        }
    )+};
}

on_database!(sqlite, postgres, mariadb);
