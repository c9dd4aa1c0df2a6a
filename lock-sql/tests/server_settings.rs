//! The backend against server settings and mistakes: durable fencing whatever the role's
//! `synchronous_commit`, a token sequence with a cache refused, a pool of one connection,
//! releases that do not depend on NOTIFY, and configuration mistakes (no such database,
//! a lock table of another shape, TLS the server does not offer) reported as
//! `Misconfigured` with what to fix.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use conformance_tests::within;
use lock_core::{AcquireOptions, ErrorKind, LockClient, Renewal};
use sqlx::{Connection, Executor, MySqlConnection, PgConnection};

mod support;
use support::Database;

async fn postgres_run(db: &Database, statements: &[&str]) {
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    for statement in statements {
        conn.execute(sqlx::AssertSqlSafe(statement.to_string()))
            .await
            .unwrap();
    }
}

/// The role's default is `synchronous_commit = off`; the backend's own connections commit
/// synchronously anyway, so grants acknowledged just before the server is killed are
/// still there after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_grants_survive_a_crash_whatever_the_role_default() {
    let mut db = Database::postgres().await.unwrap();
    postgres_run(&db, &["ALTER ROLE postgres SET synchronous_commit = off"]).await;
    let client = LockClient::new(db.backend().await).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(60),
        renewal: Renewal::Manual,
        ..AcquireOptions::default()
    });
    let mut granted = Vec::new();
    for n in 0..30 {
        let guard = client.lock(format!("crash/{n}")).await.unwrap();
        granted.push((format!("crash/{n}"), guard.token()));
        std::mem::forget(guard);
    }
    db.server.as_mut().unwrap().kill().unwrap();
    db.server.as_mut().unwrap().restart().await.unwrap();
    let observer = LockClient::new(db.backend().await);
    for (key, token) in granted {
        let held = observer.inspect(&key).await.unwrap();
        assert_eq!(
            held.map(|info| info.token),
            Some(token),
            "the acknowledged grant of {key} was lost in the crash"
        );
    }
}

/// A token sequence someone created with a cache hands out values out of order across
/// connections: connecting refuses it and says how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sequence_with_a_cache_is_refused() {
    let db = Database::postgres().await.unwrap();
    postgres_run(
        &db,
        &["CREATE SEQUENCE cached_locks_tokens AS bigint CACHE 20"],
    )
    .await;
    let err = lock_sql::connect(&db.url_with("table=cached_locks"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
    assert!(err.to_string().contains("CACHE 1"), "{err}");
}

/// With a pool of one connection the backend still works: the LISTEN connection is
/// its own, and waiters are still woken by a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pool_of_one_connection_works() {
    let db = Database::postgres().await.unwrap();
    let url = db.url_with("pool_size=1&connect_timeout_ms=2000");
    let backend = within(
        Duration::from_secs(10),
        "connecting",
        lock_sql::connect(&url),
    )
    .await
    .unwrap()
    .unwrap();
    let holder = LockClient::new(backend.clone());
    let waiter = LockClient::new(backend);
    let guard = within(Duration::from_secs(10), "locking", holder.lock("one"))
        .await
        .unwrap()
        .unwrap();
    let waiting =
        tokio::spawn(async move { waiter.lock("one").wait_up_to(Duration::from_secs(10)).await });
    within(Duration::from_secs(10), "releasing", guard.release())
        .await
        .unwrap()
        .unwrap();
    let next = within(Duration::from_secs(10), "the waiter", waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

/// A notification that fails (here refused: the role may not call pg_notify; in
/// production a full notification queue) does not undo or fail the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_release_does_not_depend_on_notify() {
    let db = Database::postgres().await.unwrap();
    postgres_run(
        &db,
        &[
            "CREATE ROLE plain LOGIN PASSWORD 'plain-password'",
            "GRANT CREATE ON SCHEMA public TO plain",
            "REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC",
        ],
    )
    .await;
    let port = db.server.as_ref().unwrap().port();
    let url = format!(
        "postgres://plain:plain-password@127.0.0.1:{port}/postgres?sslmode=disable&table=plain_locks"
    );
    let client = LockClient::new(lock_sql::connect(&url).await.unwrap());
    let guard = client.lock("notify-refused").await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(client.inspect("notify-refused").await.unwrap(), None);
}

/// A database that does not exist is a configuration mistake, named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_database_is_misconfigured() {
    let pg = Database::postgres().await.unwrap();
    let url = pg.url.replace("/postgres?", "/no_such_db?");
    let err = lock_sql::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    let maria = Database::mariadb().await.unwrap();
    let port = maria.server.as_ref().unwrap().port();
    let err = lock_sql::connect(&format!("mysql://root@127.0.0.1:{port}/no_such_db"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
}

/// A table of the configured name that is not a lock table: connecting or the first
/// lock call fails as `Misconfigured`, saying what to do.
async fn wrong_table_shape_is_misconfigured(db: Database) {
    let create = "CREATE TABLE odd_locks (lock_key VARCHAR(200) PRIMARY KEY, owner TEXT)";
    match db.name {
        "postgres" => postgres_run(&db, &[create]).await,
        "mysql" => {
            let mut conn = MySqlConnection::connect(&db.url).await.unwrap();
            conn.execute(create).await.unwrap();
        }
        _ => {
            let file = db.url.trim_start_matches("sqlite://");
            let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{file}?mode=rwc"))
                .await
                .unwrap();
            conn.execute(create).await.unwrap();
        }
    }
    let outcome = async {
        let backend = lock_sql::connect(&db.url_with("table=odd_locks")).await?;
        LockClient::new(backend).try_lock("shape").await.map(drop)
    };
    let err = outcome.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{} {err}", db.name);
    assert!(err.to_string().contains("?table="), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wrong_table_shape_is_misconfigured() {
    wrong_table_shape_is_misconfigured(Database::postgres().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_wrong_table_shape_is_misconfigured() {
    wrong_table_shape_is_misconfigured(Database::mariadb().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_wrong_table_shape_is_misconfigured() {
    wrong_table_shape_is_misconfigured(Database::sqlite().await.unwrap()).await;
}

/// TLS required of a server that does not offer it: a permanent mistake, not an outage
/// to wait out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_the_server_lacks_is_misconfigured() {
    let pg = Database::postgres().await.unwrap();
    let err = lock_sql::connect(&pg.url.replace("sslmode=disable", "sslmode=require"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err} {err:?}");
    let maria = Database::mariadb().await.unwrap();
    let err = lock_sql::connect(&maria.url_with("ssl-mode=REQUIRED"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err} {err:?}");
}
