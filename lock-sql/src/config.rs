//! Connection settings, parsed from a URL or built in code.

use std::fmt;
use std::time::Duration;

use lock_core::{redact_url, Error, ErrorKind, Result};

/// The SQL dialect a URL selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite, one database file shared by the processes of one machine (`sqlite://`).
    Sqlite,
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// MariaDB 10.5 or newer (`mysql://`, `mariadb://`); it needs `INSERT ... RETURNING`.
    MySql,
}

impl Dialect {
    /// The backend name used in logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
        }
    }

    fn from_scheme(scheme: &str) -> Option<Self> {
        match scheme {
            "sqlite" => Some(Dialect::Sqlite),
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::MySql),
            _ => None,
        }
    }
}

/// Where the lock table lives and how to reach it.
///
/// Build one with [`SqlConfig::from_url`], then adjust the public fields. The URL
/// query may set `table`, `pool_size` and `connect_timeout_ms`; other query parameters
/// are passed on to the driver (PostgreSQL and MySQL) or refused (SQLite).
///
/// `Debug` shows the URL with its password replaced.
#[derive(Clone)]
pub struct SqlConfig {
    dialect: Dialect,
    /// The driver URL without this crate's query parameters (PostgreSQL, MySQL), or the
    /// database file path (SQLite).
    target: String,
    /// The lock table's name: an ASCII letter or `_`, then up to 47 letters, digits or
    /// `_` (room for the `_tokens` suffix within every dialect's identifier limit).
    /// Default `distlock_locks`.
    pub table: String,
    /// Connections in the pool. Default 10.
    pub pool_size: u32,
    /// How long to wait for a pooled connection, including connecting; a database that
    /// cannot be reached within it is [`ErrorKind::Unavailable`]. Default 5 s.
    pub connect_timeout: Duration,
}

/// The URL schemes [`SqlConfig::from_url`] accepts.
pub const SCHEMES: &[&str] = &["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

const DEFAULT_TABLE: &str = "distlock_locks";
const MAX_TABLE_LEN: usize = 48;

impl SqlConfig {
    /// Parses `sqlite:///abs/path.db`, `sqlite://relative.db`, `postgres://...`,
    /// `postgresql://...`, `mysql://...` or `mariadb://...`, with optional
    /// `?table=...&pool_size=...&connect_timeout_ms=...`.
    pub fn from_url(url: &str) -> Result<Self> {
        let invalid = |what: &str| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{what} in database URL {}", redact_url(url)),
            )
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("no scheme (expected e.g. sqlite:// or postgres://)"))?;
        let dialect = Dialect::from_scheme(&scheme.to_ascii_lowercase())
            .ok_or_else(|| invalid(&format!("unsupported scheme {scheme:?}")))?;
        let (base, query) = match rest.split_once('?') {
            Some((base, query)) => (base, query),
            None => (rest, ""),
        };
        let mut config = SqlConfig {
            dialect,
            target: String::new(),
            table: DEFAULT_TABLE.to_owned(),
            pool_size: 10,
            connect_timeout: Duration::from_secs(5),
        };
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "table" => config.table = value.to_owned(),
                "pool_size" => {
                    config.pool_size = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| invalid("pool_size is not a positive integer"))?;
                }
                "connect_timeout_ms" => {
                    let ms: u64 =
                        value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            invalid("connect_timeout_ms is not a positive integer")
                        })?;
                    config.connect_timeout = Duration::from_millis(ms);
                }
                _ if dialect == Dialect::Sqlite => {
                    return Err(invalid(&format!("unknown query parameter {name:?}")));
                }
                _ => passed_on.push(pair),
            }
        }
        validate_table(&config.table)?;
        config.target = match dialect {
            Dialect::Sqlite => {
                if base.is_empty() || base.starts_with(':') {
                    return Err(invalid(
                        "no database file (an in-memory SQLite database cannot be shared)",
                    ));
                }
                base.to_owned()
            }
            Dialect::Postgres | Dialect::MySql => {
                // sqlx knows `mysql://` only; MariaDB speaks the same protocol.
                let scheme = if dialect == Dialect::MySql {
                    "mysql"
                } else {
                    scheme
                };
                let mut target = format!("{scheme}://{base}");
                if !passed_on.is_empty() {
                    target.push('?');
                    target.push_str(&passed_on.join("&"));
                }
                target
            }
        };
        Ok(config)
    }

    /// The dialect the URL selected.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The driver URL (PostgreSQL, MySQL) or the database file path (SQLite), with
    /// credentials; never log it, use the `Debug` output instead.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("dialect", &self.dialect)
            .field("target", &redact_url(&self.target))
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Refuses table names that are not plain identifiers, so the name can be spliced into
/// SQL text without quoting and without any possibility of injection.
pub(crate) fn validate_table(table: &str) -> Result<()> {
    let mut chars = table.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if first_ok && rest_ok && table.len() <= MAX_TABLE_LEN {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "table name {table:?} must be an ASCII letter or '_' followed by at most \
                 {} letters, digits or '_'",
                MAX_TABLE_LEN - 1
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed() {
        let c = SqlConfig::from_url("sqlite:///tmp/x.db?table=my_locks&pool_size=3").unwrap();
        assert_eq!(c.dialect(), Dialect::Sqlite);
        assert_eq!(c.target(), "/tmp/x.db");
        assert_eq!(c.table, "my_locks");
        assert_eq!(c.pool_size, 3);
        let c = SqlConfig::from_url("sqlite://rel.db").unwrap();
        assert_eq!(c.target(), "rel.db");
        let c = SqlConfig::from_url(
            "postgresql://u:secret@127.0.0.1:5/db?sslmode=disable&table=t&connect_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(c.dialect(), Dialect::Postgres);
        assert_eq!(
            c.target(),
            "postgresql://u:secret@127.0.0.1:5/db?sslmode=disable"
        );
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        let c = SqlConfig::from_url("mariadb://root@127.0.0.1:5/db").unwrap();
        assert_eq!(c.target(), "mysql://root@127.0.0.1:5/db");
        assert!(!format!("{c:?}").contains("secret"));
        let c = SqlConfig::from_url("postgres://u:secret@h/db").unwrap();
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn bad_urls_are_invalid_input() {
        for url in [
            "nothing",
            "redis://x",
            "sqlite://",
            "sqlite://:memory:",
            "sqlite:///x.db?bogus=1",
            "sqlite:///x.db?pool_size=0",
            "postgres://h/db?table=a;drop",
            "postgres://u:secret@h/db?table=1abc",
        ] {
            let err = SqlConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        assert!(validate_table(&"a".repeat(48)).is_ok());
        assert!(validate_table(&"a".repeat(49)).is_err());
        assert!(validate_table("").is_err());
        assert!(validate_table("bad-name").is_err());
    }
}
