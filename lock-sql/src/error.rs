//! Mapping sqlx errors into the core's error kinds.

use lock_core::{Error, ErrorKind};

use crate::config::Dialect;

/// `err`, met while doing `doing` on a `dialect` database, as a distlock error.
///
/// Messages never include the connection URL: they name the database, the operation and
/// what to fix, and a configuration error (which may quote the URL it refers to) is not
/// attached as the source.
pub(crate) fn into_error(err: sqlx::Error, doing: &str, dialect: Dialect) -> Error {
    let (kind, what) = classify(dialect, &err);
    let error = Error::store(dialect.name(), doing, kind).hint(what);
    match err {
        sqlx::Error::Configuration(_) => error,
        _ => error.with_source(err),
    }
}

/// Whether `err` is a statement that gave up waiting for another transaction's lock
/// (MariaDB's lock wait time-out, 1205, PostgreSQL's `lock_timeout`, 55P03, both of which
/// the acquire statement sets short); the statement was rolled back, so it wrote nothing.
pub(crate) fn lock_wait_timed_out(dialect: Dialect, err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let code = error_code(db.as_ref());
    match dialect {
        Dialect::MySql => code.as_deref() == Some("1205"),
        Dialect::Postgres => code.as_deref() == Some("55P03"),
        Dialect::Sqlite => false,
    }
}

/// Whether `err` made its transaction the victim of a deadlock (MariaDB 1213, PostgreSQL
/// 40P01): the transaction was rolled back, so it wrote nothing.
pub(crate) fn deadlock_victim(dialect: Dialect, err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let code = error_code(db.as_ref());
    match dialect {
        Dialect::MySql => code.as_deref() == Some("1213"),
        Dialect::Postgres => code.as_deref() == Some("40P01"),
        Dialect::Sqlite => false,
    }
}

/// Whether `err`, a store error [`into_error`] made, tells of a statement chosen as a
/// deadlock's victim ([`deadlock_victim`]): rolled back, it wrote nothing, and the same
/// statement may simply be sent again.
pub(crate) fn lost_a_deadlock(dialect: Dialect, err: &Error) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(|source| deadlock_victim(dialect, source))
}

const UNREACHABLE: &str = "the database could not be reached or is busy";
const REFUSED: &str = "the database refused the credentials or the operation";
const UNEXPECTED: &str = "unexpected database error";
const NO_DATABASE: &str = "the database named in the URL does not exist: create it, or \
     correct the URL's path";
const TABLE_SHAPE: &str = "the lock table or its token counter is missing or does not have \
     the columns this version expects: let `connect` create it (a backend built with `new` \
     must run `migrate` first), or choose another table with ?table=";

fn classify(dialect: Dialect, err: &sqlx::Error) -> (ErrorKind, &'static str) {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => (ErrorKind::Unavailable, UNREACHABLE),
        // A certificate that is not trusted or does not match, a server without TLS, or
        // TLS asked of a build without it: retrying cannot help.
        sqlx::Error::Tls(_) => (
            ErrorKind::Misconfigured,
            "TLS could not be set up (no TLS support built into the driver, an untrusted or \
             mismatched certificate, or a server without TLS): check the URL's sslmode and \
             certificate options",
        ),
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => (
            ErrorKind::InvalidInput,
            "the database configuration is invalid",
        ),
        sqlx::Error::Database(db) => {
            let code = error_code(db.as_ref());
            let code = code.as_deref().unwrap_or("");
            match dialect {
                Dialect::Postgres => postgres_code(code),
                Dialect::MySql => mysql_code(code),
                Dialect::Sqlite => sqlite_code(code, db.message()),
            }
        }
        _ => (ErrorKind::Internal, UNEXPECTED),
    }
}

/// MySQL's `code()` is the SQLSTATE; its error number says more.
fn error_code(db: &dyn sqlx::error::DatabaseError) -> Option<String> {
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return Some(mysql.number().to_string());
    }
    db.code().map(|code| code.into_owned())
}

/// Classifies a SQLSTATE.
fn postgres_code(code: &str) -> (ErrorKind, &'static str) {
    match (code.get(..2), code) {
        // Invalid authorization; insufficient privilege.
        (Some("28"), _) | (_, "42501") => (ErrorKind::PermissionDenied, REFUSED),
        // A read-only transaction: a standby, or a primary being demoted in a failover.
        (_, "25006") => (
            ErrorKind::Unavailable,
            "the database is read-only (a standby, or a failover in progress)",
        ),
        // Connection exception; serialization failure or deadlock; resources; operator
        // intervention (shutdown, cancelled by the statement time-out, starting up).
        (Some("08" | "40" | "53" | "57"), _) => (ErrorKind::Unavailable, UNREACHABLE),
        // A lock wait past lock_timeout (set by an `options` parameter).
        (_, "55P03") => (ErrorKind::Unavailable, UNREACHABLE),
        (_, "3D000") => (ErrorKind::Misconfigured, NO_DATABASE),
        // Undefined table or column, wrong data type, a table where a sequence belongs.
        (_, "42P01" | "42703" | "42804" | "42809") => (ErrorKind::Misconfigured, TABLE_SHAPE),
        _ => (ErrorKind::Internal, UNEXPECTED),
    }
}

/// Classifies a MySQL/MariaDB error number.
fn mysql_code(code: &str) -> (ErrorKind, &'static str) {
    match code.parse::<u32>() {
        // Access denied (user, database, table, privilege).
        Ok(1044 | 1045 | 1142 | 1227 | 1698) => (ErrorKind::PermissionDenied, REFUSED),
        // Creating the token trigger with binary logging on.
        Ok(1419) => (
            ErrorKind::PermissionDenied,
            "creating the token trigger needs the TRIGGER privilege and, with binary logging \
             on, SUPER or log_bin_trust_function_creators=1",
        ),
        // Read-only server or transaction (a replica, or a failover in progress).
        Ok(1290 | 1792) => (
            ErrorKind::Unavailable,
            "the database is read-only (a replica, or a failover in progress)",
        ),
        // Too many connections, shutdown, lock wait timeout, deadlock, query interrupted,
        // connection killed, statement time-out, idle disconnect, server gone away, lost
        // connection.
        Ok(1040 | 1053 | 1205 | 1213 | 1317 | 1927 | 1969 | 4031 | 2006 | 2013) => {
            (ErrorKind::Unavailable, UNREACHABLE)
        }
        Ok(1049) => (ErrorKind::Misconfigured, NO_DATABASE),
        // Unknown column, no such table, a column without a default.
        Ok(1054 | 1146 | 1364) => (ErrorKind::Misconfigured, TABLE_SHAPE),
        _ => (ErrorKind::Internal, UNEXPECTED),
    }
}

/// Classifies an (extended) SQLite result code; the generic SQLITE_ERROR says only in its
/// message that a table or column is missing.
fn sqlite_code(code: &str, message: &str) -> (ErrorKind, &'static str) {
    // Primary result codes are the low byte of extended ones.
    match code.parse::<u32>().map(|n| n & 0xff) {
        // SQLITE_PERM, SQLITE_READONLY, SQLITE_AUTH.
        Ok(3 | 8 | 23) => (ErrorKind::PermissionDenied, REFUSED),
        // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN,
        // SQLITE_PROTOCOL.
        Ok(5 | 6 | 10 | 13 | 14 | 15) => (ErrorKind::Unavailable, UNREACHABLE),
        Ok(1)
            if ["no such table", "no such column", "has no column"]
                .iter()
                .any(|shape| message.contains(shape)) =>
        {
            (ErrorKind::Misconfigured, TABLE_SHAPE)
        }
        _ => (ErrorKind::Internal, UNEXPECTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        let pg = |code| postgres_code(code).0;
        assert_eq!(pg("28P01"), ErrorKind::PermissionDenied);
        assert_eq!(pg("28000"), ErrorKind::PermissionDenied);
        assert_eq!(pg("42501"), ErrorKind::PermissionDenied);
        for transient in [
            "57P01", "57P02", "57P03", "57014", "40001", "25006", "08006", "55P03",
        ] {
            assert_eq!(pg(transient), ErrorKind::Unavailable, "{transient}");
        }
        assert_eq!(pg("3D000"), ErrorKind::Misconfigured);
        assert_eq!(pg("42703"), ErrorKind::Misconfigured);
        assert_eq!(pg("42P01"), ErrorKind::Misconfigured);
        assert_eq!(pg("23505"), ErrorKind::Internal);
        let my = |code| mysql_code(code).0;
        assert_eq!(my("1045"), ErrorKind::PermissionDenied);
        assert_eq!(my("1419"), ErrorKind::PermissionDenied);
        assert_eq!(my("1142"), ErrorKind::PermissionDenied);
        for transient in ["1213", "1205", "1290", "1792", "1927", "1969", "4031"] {
            assert_eq!(my(transient), ErrorKind::Unavailable, "{transient}");
        }
        assert_eq!(my("1049"), ErrorKind::Misconfigured);
        assert_eq!(my("1054"), ErrorKind::Misconfigured);
        assert_eq!(my("1062"), ErrorKind::Internal);
        let lite = |code, message| sqlite_code(code, message).0;
        assert_eq!(lite("5", ""), ErrorKind::Unavailable);
        assert_eq!(lite("517", ""), ErrorKind::Unavailable);
        assert_eq!(lite("8", ""), ErrorKind::PermissionDenied);
        assert_eq!(lite("1", "no such column: token"), ErrorKind::Misconfigured);
        assert_eq!(lite("1", "near \"x\": syntax error"), ErrorKind::Internal);
        assert_eq!(lite("19", ""), ErrorKind::Internal);
    }
}
