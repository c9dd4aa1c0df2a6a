//! SQLite: one database file in WAL mode shared by the processes of one machine.

use std::str::FromStr;

use lock_core::Result;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteQueryResult, SqliteSynchronous};
use sqlx::{Pool, Sqlite};

use super::{sql_text, RowsAffected, SqlText};
use crate::config::{Dialect, SqlConfig};
use crate::error::map;

/// How long a statement waits for another process's write before it fails with
/// "database is locked"; SQLite serialises writers, so this is queueing, not failure.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) const SQL: SqlText = sql_text!(
    "sqlite",
    // julianday('now') has millisecond resolution and is fixed for one statement.
    now_ms: "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
);

impl RowsAffected for SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// A pool over the database file, created if missing. No connection is opened yet.
pub(crate) fn pool(config: &SqlConfig) -> Result<Pool<Sqlite>> {
    let options = SqliteConnectOptions::from_str("sqlite:")
        .map_err(|err| map(Dialect::Sqlite, "configuring SQLite", err))?
        .filename(config.target())
        .create_if_missing(true)
        .busy_timeout(BUSY_TIMEOUT)
        .journal_mode(SqliteJournalMode::Wal)
        // In WAL mode NORMAL loses no committed transaction on a process crash, only
        // (possibly) the last ones on power loss, grants and their tokens together (see
        // the caveats in docs.md).
        .synchronous(SqliteSynchronous::Normal);
    Ok(super::lazy_pool(config, options))
}
