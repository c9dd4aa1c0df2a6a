//! SQLite: one database file in WAL mode shared by the processes of one machine.

use std::path::Path;
use std::time::{Duration, Instant};

use lock_core::Backoff;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteQueryResult, SqliteSynchronous};
use sqlx::{Pool, Sqlite};

use super::{hold_text, pool_options, sql_text, RowsAffected, SqlText, Turn};
use crate::config::{self, SqlConfig};

/// How long a statement waits for another process's write before it fails with
/// "database is locked"; SQLite serialises writers, so this is queueing, not failure.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Pauses between attempts to switch a new database file to WAL: short, since the other
/// process holds the write lock only for the switch.
const WAL_RETRY: Backoff = Backoff {
    initial: Duration::from_millis(1),
    max: Duration::from_millis(20),
};

/// julianday('now') has millisecond resolution and is fixed for one statement, so it is
/// both the statement's start and the time a row is written.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

pub(crate) const SQL: SqlText = sql_text!(
    "sqlite",
    now_ms: NOW_MS,
    clock_ms: NOW_MS,
    // BEGIN IMMEDIATE takes the database's write lock at once (queueing within the busy
    // timeout): a deferred transaction that read first could not upgrade to a writer
    // while another process writes, and would fail instead of wait.
    holds: hold_text!("sqlite", begin: "BEGIN IMMEDIATE", turn: Turn::Begin, renewed: None)
);

impl RowsAffected for SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// A pool over the database file, created if missing. No connection is opened yet.
pub(crate) fn pool(config: &SqlConfig, file: &str) -> Pool<Sqlite> {
    let synchronous = match config.sqlite_synchronous {
        config::SqliteSynchronous::Normal => SqliteSynchronous::Normal,
        config::SqliteSynchronous::Full => SqliteSynchronous::Full,
    };
    let options = SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(true)
        .busy_timeout(BUSY_TIMEOUT)
        // In WAL mode NORMAL loses no committed transaction on a process crash, only
        // (possibly) the last ones on power loss, grants and their tokens together; FULL
        // loses none (see the caveats in docs.md).
        .synchronous(synchronous);
    pool_options(config)
        .after_connect(|conn, _| Box::pin(use_wal(conn)))
        .connect_lazy_with(options)
}

/// Switches the database to WAL (a no-op once any process did), retrying while the
/// switch is refused as busy. Switching a new file reads its header and then takes the
/// write lock; SQLite does not wait (busy timeout or not) when another process took the
/// write lock in between, since waiting while holding the read could deadlock, so
/// processes that open a new file together would otherwise fail now and then.
async fn use_wal(conn: &mut SqliteConnection) -> sqlx::Result<()> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    // Lent to one try at a time.
    let conn = tokio::sync::Mutex::new(conn);
    let (outcome, _) = WAL_RETRY
        .retry_until(Some(deadline), is_busy, || async {
            let mut conn = conn.lock().await;
            sqlx::raw_sql("PRAGMA journal_mode = WAL")
                .execute(&mut **conn)
                .await
        })
        .await;
    outcome.map(drop)
}

/// Why `file` cannot be opened, when `err` is SQLITE_CANTOPEN for a reason retrying cannot
/// mend: the directory it should be in is missing (SQLite creates the file, never its
/// directory) or is not a directory. `None` otherwise.
pub(crate) fn cannot_open(file: &str, err: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = err else {
        return None;
    };
    let code = db.code()?.parse::<u32>().ok()?;
    // SQLITE_CANTOPEN.
    if code & 0xff != 14 {
        return None;
    }
    let dir = Path::new(file)
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())?;
    match std::fs::metadata(dir) {
        Err(missing) if missing.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "the directory {} of the SQLite database file does not exist: create it (SQLite              creates the file, not its directory), or correct the URL's path",
            dir.display()
        )),
        Ok(meta) if !meta.is_dir() => Some(format!(
            "{} is not a directory, so the SQLite database file cannot be created in it:              correct the URL's path",
            dir.display()
        )),
        _ => None,
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED, in any extended form.
fn is_busy(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    db.code()
        .and_then(|code| code.parse::<u32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}
