//! Opening a new SQLite file while another connection writes to it: the backend's switch
//! to WAL is refused as busy at once (SQLite does not wait when it would have to wait
//! while holding a read lock), and connecting must ride that out, not fail.
//!
//! `tests/two_processes.rs` shows the same with many processes opening a new file at once.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lock_core::LockClient;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Executor};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_rides_out_a_writer_on_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    // Another process's connection, in the middle of a write transaction on the new file
    // (as when it switches the file to WAL or creates the table).
    let mut writer = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    writer.execute("BEGIN IMMEDIATE").await.unwrap();
    writer.execute("CREATE TABLE other (x)").await.unwrap();
    let url = format!("sqlite://{}", path.display());
    let mut connecting = tokio::spawn(async move { lock_sql::connect(&url).await });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut connecting).await;
    assert!(
        early.is_err(),
        "connecting gave up while the other connection wrote: {early:?}"
    );
    writer.execute("COMMIT").await.unwrap();
    let backend = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let client = LockClient::new(backend);
    client
        .lock("opened")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// The README's own example path on a machine without the directory: SQLite creates the
/// file, never its directory, and retrying cannot help, so the error must say which
/// directory is missing and must not be retryable "unreachable".
#[tokio::test]
async fn a_file_in_a_missing_directory_is_a_clear_non_retryable_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("myapp");
    let url = format!("sqlite://{}", missing.join("locks.db").display());
    let err = lock_sql::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Misconfigured, "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    assert!(
        err.message().contains(&missing.display().to_string()),
        "the error does not name the missing directory: {err}"
    );
    // A plain file where the directory should be.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let url = format!("sqlite://{}", file.join("locks.db").display());
    let err = lock_sql::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Misconfigured, "{err:?}");
    assert!(
        err.message().contains(&file.display().to_string()),
        "the error does not name the path: {err}"
    );
}
