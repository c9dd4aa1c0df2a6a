//! Connection settings, parsed from a URL or built in code.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use lock_core::backend::StoreUrl;
use lock_core::{Error, ErrorKind, Result};

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

    /// Driver query parameters passed on as they are: none carries a secret or changes
    /// what the lock table's times mean.
    fn passed_on(self) -> &'static [&'static str] {
        match self {
            Dialect::Sqlite => &[],
            Dialect::Postgres => &[
                "sslmode",
                "ssl-mode",
                "sslrootcert",
                "ssl-root-cert",
                "ssl-ca",
                "sslcert",
                "ssl-cert",
                "sslkey",
                "ssl-key",
                "statement-cache-capacity",
                "application_name",
                "options",
                "host",
                "hostaddr",
                "port",
                "dbname",
                "user",
            ],
            Dialect::MySql => &[
                "sslmode",
                "ssl-mode",
                "sslca",
                "ssl-ca",
                "sslcert",
                "ssl-cert",
                "sslkey",
                "ssl-key",
                "charset",
                "collation",
                "statement-cache-capacity",
                "socket",
            ],
        }
    }

    /// Why the parameter `name=value` is refused although the driver knows it: it would
    /// undo a setting the backend's guarantees rest on.
    fn refuses(self, name: &str, value: &str) -> Option<&'static str> {
        let pinned = |text: &str| {
            let text = text.to_ascii_lowercase();
            PG_PINNED.iter().any(|setting| text.contains(setting))
        };
        match self {
            Dialect::MySql if matches!(name, "timezone" | "time-zone") => Some(
                "the session time zone is pinned to UTC, because lock expiry is computed \
                 from the server's local time",
            ),
            Dialect::Postgres
                if (name == "options" && pinned(value))
                    || (name.starts_with("options[") && pinned(name)) =>
            {
                Some(
                    "options may not set synchronous_commit or statement_timeout: the backend \
                     sets them itself (synchronous_commit=on for durable fencing tokens; use \
                     statement_timeout_ms for the other)",
                )
            }
            _ => None,
        }
    }
}

/// PostgreSQL settings the backend sets on its own connections.
const PG_PINNED: &[&str] = &["synchronous_commit", "statement_timeout"];

/// How SQLite makes each commit durable (the URL's `synchronous=normal|full`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SqliteSynchronous {
    /// `synchronous=NORMAL`: a commit survives any process crash; an operating-system
    /// crash or power loss may undo the last commits (grants and their tokens together).
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is on disk before it is acknowledged, so grants
    /// and fencing tokens survive power loss too, at the cost of one disk flush per
    /// acquire, renew and release.
    Full,
}

/// Where the lock table lives and how to reach it.
///
/// Build one with [`SqlConfig::from_url`], then adjust the public fields. The URL
/// query may set `table`, `pool_size`, `connect_timeout_ms`, `statement_timeout_ms` and,
/// for SQLite, `synchronous`; a few driver parameters are passed on (TLS settings and
/// the like; `password` is taken as the password), and any other parameter is refused.
///
/// `Debug` never shows the password.
#[derive(Clone)]
pub struct SqlConfig {
    dialect: Dialect,
    location: Location,
    /// The lock table's name: an ASCII letter or `_`, then up to 47 letters, digits or
    /// `_` (room for the `_tokens` suffix within every dialect's identifier limit).
    /// Default `distlock_locks`.
    pub table: String,
    /// Connections in the pool. Default 10. A PostgreSQL backend opens one more, of
    /// its own, for LISTEN.
    pub pool_size: u32,
    /// How long to wait for a pooled connection, including connecting; a database that
    /// cannot be reached within it is [`ErrorKind::Unavailable`]. Default 5 s.
    pub connect_timeout: Duration,
    /// How long one statement may run. PostgreSQL (`statement_timeout`) and MariaDB
    /// (`max_statement_time`) cancel it then; a statement whose answer has not arrived a
    /// second later (a network that swallowed it) has its connection closed, so it
    /// cannot keep a pool slot. Keep it above the lock calls' request time-out. Default
    /// 10 s.
    pub statement_timeout: Duration,
    /// SQLite only: how each commit is made durable. Default
    /// [`SqliteSynchronous::Normal`].
    pub sqlite_synchronous: SqliteSynchronous,
}

/// What the URL names besides this crate's own parameters.
#[derive(Clone)]
enum Location {
    /// SQLite: the database file.
    File(String),
    /// PostgreSQL, MySQL: the server URL (without this crate's parameters and without a
    /// `password` parameter) and the password, from the user info or `?password=`.
    Server {
        url: StoreUrl,
        password: Option<String>,
    },
}

/// The URL schemes [`SqlConfig::from_url`] accepts (each dialect served only with its
/// cargo feature).
pub(crate) const SCHEMES: &[&str] = &["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

const DEFAULT_TABLE: &str = "distlock_locks";
const MAX_TABLE_LEN: usize = 48;

impl SqlConfig {
    /// Parses `sqlite:///abs/path.db`, `sqlite://relative.db`, `postgres://...`,
    /// `postgresql://...`, `mysql://...` or `mariadb://...`, with optional
    /// `?table=...&pool_size=...&connect_timeout_ms=...&statement_timeout_ms=...` and
    /// (SQLite) `synchronous=normal|full`.
    ///
    /// Reserved characters (`/ ? # @ : %`) in the user name or password must be
    /// percent-encoded. Errors show the URL with its password hidden.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut url = StoreUrl::parse_either(url, &["sqlite"])?;
        let dialect = match url.expect_scheme(SCHEMES)? {
            "sqlite" => Dialect::Sqlite,
            "postgres" | "postgresql" => Dialect::Postgres,
            _ => Dialect::MySql,
        };
        let mut config = SqlConfig {
            dialect,
            location: Location::File(String::new()),
            table: url
                .take_param("table")
                .unwrap_or_else(|| DEFAULT_TABLE.to_owned()),
            pool_size: url
                .take_parsed::<NonZeroU32>("pool_size", "a positive integer")?
                .map_or(10, NonZeroU32::get),
            connect_timeout: url
                .take_millis("connect_timeout_ms")?
                .unwrap_or(Duration::from_secs(5)),
            statement_timeout: url
                .take_millis("statement_timeout_ms")?
                .unwrap_or(Duration::from_secs(10)),
            sqlite_synchronous: SqliteSynchronous::default(),
        };
        validate_table(&config.table)?;
        config.location = match dialect {
            Dialect::Sqlite => {
                let synchronous = [
                    ("normal", SqliteSynchronous::Normal),
                    ("full", SqliteSynchronous::Full),
                ];
                config.sqlite_synchronous = url
                    .take_choice("synchronous", &synchronous)?
                    .unwrap_or_default();
                url.finish()?;
                let path = url.path();
                if path.is_empty() || path.starts_with(':') {
                    return Err(url.error(
                        "no database file (an in-memory SQLite database cannot be shared)",
                    ));
                }
                Location::File(path.to_owned())
            }
            Dialect::Postgres | Dialect::MySql => {
                let password = url
                    .take_param("password")
                    .or_else(|| url.password().map(str::to_owned));
                for (name, value) in url.query() {
                    if let Some(why) = dialect.refuses(name, value) {
                        return Err(url.error(&format!("{name}: {why}")));
                    }
                    let known = dialect.passed_on().contains(&name.as_str())
                        || (dialect == Dialect::Postgres && name.starts_with("options["));
                    if !known {
                        return Err(url.unknown_option(name));
                    }
                }
                if url.hosts().len() != 1 {
                    return Err(url.error("exactly one host is needed"));
                }
                Location::Server { url, password }
            }
        };
        Ok(config)
    }

    /// The dialect the URL selected.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The database file (SQLite), or `None` for a server.
    pub(crate) fn file(&self) -> Option<&str> {
        match &self.location {
            Location::File(path) => Some(path),
            Location::Server { .. } => None,
        }
    }

    /// The server URL (PostgreSQL, MySQL) without a password parameter, and the
    /// password; never log the password.
    #[cfg(any(feature = "postgres", feature = "mysql", test))]
    pub(crate) fn server(&self) -> Option<(&StoreUrl, Option<&str>)> {
        match &self.location {
            Location::Server { url, password } => Some((url, password.as_deref())),
            Location::File(_) => None,
        }
    }
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("SqlConfig");
        debug.field("dialect", &self.dialect);
        match &self.location {
            Location::File(path) => debug.field("file", path),
            Location::Server { url, password } => debug
                .field("url", &url.redacted())
                .field("password", &password.as_ref().map(|_| "***")),
        };
        debug
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("sqlite_synchronous", &self.sqlite_synchronous)
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

    /// Everything a caller could print about a configuration result.
    fn shown(result: &Result<SqlConfig>) -> String {
        match result {
            Ok(config) => format!("{config:?}"),
            Err(err) => conformance_tests::everything_shown(err),
        }
    }

    #[test]
    fn urls_are_parsed() {
        let c = SqlConfig::from_url("sqlite:///tmp/x.db?table=my_locks&pool_size=3").unwrap();
        assert_eq!(c.dialect(), Dialect::Sqlite);
        assert_eq!(c.file(), Some("/tmp/x.db"));
        assert_eq!(c.table, "my_locks");
        assert_eq!(c.pool_size, 3);
        assert_eq!(c.sqlite_synchronous, SqliteSynchronous::Normal);
        let c = SqlConfig::from_url("sqlite://rel.db?synchronous=FULL").unwrap();
        assert_eq!(c.file(), Some("rel.db"));
        assert_eq!(c.sqlite_synchronous, SqliteSynchronous::Full);
        let c = SqlConfig::from_url(
            "postgresql://u:se%2Fcret@127.0.0.1:5/db?sslmode=disable&table=t\
             &connect_timeout_ms=250&statement_timeout_ms=700",
        )
        .unwrap();
        assert_eq!(c.dialect(), Dialect::Postgres);
        let (url, password) = c.server().unwrap();
        assert_eq!(password, Some("se/cret"));
        assert_eq!(url.username(), "u");
        assert_eq!(url.path(), "db");
        assert_eq!(url.query(), &[("sslmode".to_owned(), "disable".to_owned())]);
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.statement_timeout, Duration::from_millis(700));
        assert!(!format!("{c:?}").contains("cret"));
        let c = SqlConfig::from_url("mariadb://root@127.0.0.1:5/db").unwrap();
        assert_eq!(c.dialect(), Dialect::MySql);
        assert_eq!(c.server().unwrap().1, None);
        let c = SqlConfig::from_url("postgres://u@h/db?password=hunter2&sslmode=disable").unwrap();
        assert_eq!(c.server().unwrap().1, Some("hunter2"));
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
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
            "sqlite:///x.db?synchronous=off",
            "sqlite:///x.db?statement_timeout_ms=-1",
            "postgres://h/db?table=a;drop",
            "postgres://u:secret@h/db?table=1abc",
            "postgres://u:secret@h1,h2/db",
            "postgres://u:secret@h/db?bogus=1",
            "postgres://u:secret@h/db?options=-c%20synchronous_commit%3Doff",
            "postgres://u:secret@h/db?options[statement_timeout]=0",
            "mysql://u:secret@h/db?timezone=Europe/Paris",
            "mysql://u:secret@h/db?time-zone=%2B01:00",
            "postgres://u:p#ss@h/db",
            "postgres://u:p/ss@h/db",
            "postgres://u:p?ss@h/db",
            "postgres://u:p@ss@h/db",
            "postgres://u@h/db?password=secret&pool_size=x",
            "mysql://u@h/db?password=secret&connect_timeout_ms=0",
            "postgres://u:secret@h:99999/db",
        ] {
            let result = SqlConfig::from_url(url);
            let text = shown(&result);
            let err = result.expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
            for secret in ["secret", "p#ss", "p/ss", "p?ss", "p@ss"] {
                assert!(!text.contains(secret), "{url}: {text}");
            }
        }
        assert!(validate_table(&"a".repeat(48)).is_ok());
        assert!(validate_table(&"a".repeat(49)).is_err());
        assert!(validate_table("").is_err());
        assert!(validate_table("bad-name").is_err());
    }

    /// Passwords drawn from the characters that confuse URL parsers, written raw, encoded
    /// and as a query parameter next to a bad option: whether the URL parses or not, no
    /// error, source chain or `Debug` output ever shows them.
    #[test]
    fn generated_passwords_never_show() {
        const ALPHABET: &[char] = &[
            'a', 'Z', '9', '/', '?', '#', '@', ':', '%', '&', '=', '+', ' ', '[', ']', ',', 'é',
            '!', '*', ';',
        ];
        let mut rng = fastrand::Rng::with_seed(0x5ec2e7);
        for _ in 0..3000 {
            // A fixed marker, so a short password cannot match by accident.
            let mut password = String::from("Qx8");
            for _ in 0..rng.usize(4..14) {
                password.push(ALPHABET[rng.usize(..ALPHABET.len())]);
            }
            let encoded = percent_encoding::utf8_percent_encode(
                &password,
                percent_encoding::NON_ALPHANUMERIC,
            )
            .to_string();
            for input in [
                format!("postgres://u:{password}@h/db"),
                format!("postgres://u:{encoded}@h/db?pool_size=x"),
                format!("postgres://u@h/db?password={password}&pool_size=x"),
                format!("postgres://u@h/db?password={encoded}&bogus=1"),
                format!("mysql://u:{password}@h:1/db?timezone=x"),
                format!("mariadb://u:{encoded}@h:1/db"),
            ] {
                let result = SqlConfig::from_url(&input);
                let text = shown(&result);
                assert!(!text.contains(&password), "{password:?} shown in {text}");
                assert!(!text.contains(&encoded), "{encoded:?} shown in {text}");
                if input.starts_with("mariadb") {
                    let config = result.expect(&input);
                    assert_eq!(
                        config.server().unwrap().1,
                        Some(password.as_str()),
                        "{input}"
                    );
                }
            }
        }
    }
}
