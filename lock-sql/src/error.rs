//! Mapping sqlx errors into the core's error kinds.

use lock_core::{Error, ErrorKind};

use crate::config::Dialect;

/// Maps a driver error into a core error; `doing` says what was being attempted.
///
/// Messages never include the connection URL: sqlx errors do not carry it, and the
/// messages built here name only the operation.
pub(crate) fn map(dialect: Dialect, doing: &str, err: sqlx::Error) -> Error {
    let kind = kind_of(dialect, &err);
    Error::new(kind, format!("{doing} failed: {}", describe(kind))).with_source(err)
}

fn describe(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Unavailable => "the database could not be reached or is busy",
        ErrorKind::PermissionDenied => "the database refused the credentials or the operation",
        ErrorKind::InvalidInput => "the database configuration is invalid",
        _ => "unexpected database error",
    }
}

fn kind_of(dialect: Dialect, err: &sqlx::Error) -> ErrorKind {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => ErrorKind::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => ErrorKind::InvalidInput,
        sqlx::Error::Database(db) => db.code().map_or(ErrorKind::Internal, |code| {
            kind_of_code(dialect, &error_code(db.as_ref(), code))
        }),
        _ => ErrorKind::Internal,
    }
}

/// MySQL's `code()` is the SQLSTATE; its error number says more.
fn error_code(db: &dyn sqlx::error::DatabaseError, code: std::borrow::Cow<'_, str>) -> String {
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql.number().to_string();
    }
    let _ = db;
    code.into_owned()
}

/// Classifies a database error code: a SQLSTATE for PostgreSQL, an error number for
/// MySQL/MariaDB, an (extended) result code for SQLite.
fn kind_of_code(dialect: Dialect, code: &str) -> ErrorKind {
    match dialect {
        Dialect::Postgres => match code.get(..2) {
            // Invalid authorization; insufficient privilege.
            Some("28") => ErrorKind::PermissionDenied,
            _ if code == "42501" => ErrorKind::PermissionDenied,
            // Connection exception; serialization failure or deadlock; resources; shutdown.
            Some("08" | "40" | "53" | "57") => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        Dialect::MySql => match code.parse::<u32>() {
            // Access denied (user, database, table, privilege).
            Ok(1044 | 1045 | 1142 | 1227 | 1698) => ErrorKind::PermissionDenied,
            // Too many connections, shutdown, lock wait timeout, deadlock, query
            // interrupted, server gone away, lost connection.
            Ok(1040 | 1053 | 1205 | 1213 | 1317 | 2006 | 2013) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        // Primary result codes are the low byte of extended ones.
        Dialect::Sqlite => match code.parse::<u32>().map(|n| n & 0xff) {
            // SQLITE_PERM, SQLITE_READONLY, SQLITE_AUTH.
            Ok(3 | 8 | 23) => ErrorKind::PermissionDenied,
            // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN,
            // SQLITE_PROTOCOL.
            Ok(5 | 6 | 10 | 13 | 14 | 15) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        let pg = |code| kind_of_code(Dialect::Postgres, code);
        assert_eq!(pg("28P01"), ErrorKind::PermissionDenied);
        assert_eq!(pg("28000"), ErrorKind::PermissionDenied);
        assert_eq!(pg("57P01"), ErrorKind::Unavailable);
        assert_eq!(pg("40001"), ErrorKind::Unavailable);
        assert_eq!(pg("23505"), ErrorKind::Internal);
        let my = |code| kind_of_code(Dialect::MySql, code);
        assert_eq!(my("1045"), ErrorKind::PermissionDenied);
        assert_eq!(my("1213"), ErrorKind::Unavailable);
        assert_eq!(my("1062"), ErrorKind::Internal);
        let lite = |code| kind_of_code(Dialect::Sqlite, code);
        assert_eq!(lite("5"), ErrorKind::Unavailable);
        assert_eq!(lite("517"), ErrorKind::Unavailable);
        assert_eq!(lite("8"), ErrorKind::PermissionDenied);
        assert_eq!(lite("19"), ErrorKind::Internal);
    }
}
