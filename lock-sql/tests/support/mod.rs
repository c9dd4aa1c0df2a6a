//! Shared by the lock-sql test targets and the SQL benchmark: private database servers
//! and conformance factories over them.
//!
//! PostgreSQL and MariaDB are started by the store-process fixture; when their binaries
//! are missing, setup fails (never skips).

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use conformance_tests::store_process::{
    StoreProcess, StoreSpec, MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER, POSTGRES_PASSWORD,
};
use conformance_tests::{BackendFactory, ServerStore};
use lock_core::backend::{async_trait, DynBackend};
use lock_sql::SqlBackend;
use std::time::Duration;

/// A private database: a temp-dir SQLite file, or a server started for the test.
pub struct Database {
    /// What keeps it alive: the server process or the temporary directory.
    pub server: Option<StoreProcess>,
    dir: Option<tempfile::TempDir>,
    /// A URL without query parameters.
    pub url: String,
    /// `sqlite`, `postgres` or `mysql`.
    pub name: &'static str,
}

impl Database {
    pub async fn sqlite() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Ok(Database {
            server: None,
            dir: Some(dir),
            url,
            name: "sqlite",
        })
    }

    pub async fn postgres() -> Result<Self, String> {
        Self::server(StoreSpec::postgres(), "postgres", |port| {
            postgres_url(port, POSTGRES_PASSWORD)
        })
        .await
    }

    pub async fn mariadb() -> Result<Self, String> {
        Self::server(StoreSpec::mariadb(), "mysql", |port| {
            mariadb_url(port, MARIADB_PASSWORD)
        })
        .await
    }

    /// A private server started from `spec`, reached through the URL `url` makes of its port.
    async fn server(
        spec: StoreSpec,
        name: &'static str,
        url: impl Fn(u16) -> String,
    ) -> Result<Self, String> {
        let server = StoreProcess::start(spec)
            .await
            .map_err(|e| format!("starting {name}: {e}"))?;
        Ok(Database {
            url: url(server.port()),
            server: Some(server),
            dir: None,
            name,
        })
    }

    /// `url` with extra query parameters (`table=...&pool_size=...`).
    pub fn url_with(&self, params: &str) -> String {
        url_with(&self.url, params)
    }

    /// The same URL aimed at another port on 127.0.0.1 (a proxy, or a closed port).
    pub fn url_via(&self, port: u16) -> String {
        let server = self.server.as_ref().expect("a server database");
        self.url
            .replace(&format!(":{}/", server.port()), &format!(":{port}/"))
    }

    pub async fn backend(&self) -> SqlBackend {
        SqlBackend::connect(lock_sql::SqlConfig::from_url(&self.url).unwrap())
            .await
            .unwrap()
    }

    /// A conformance factory over this SQLite database (taking ownership of it).
    pub async fn into_factory(self) -> Result<Arc<dyn BackendFactory>, String> {
        Ok(Arc::new(SqliteFactory { db: self }))
    }
}

pub fn url_with(url: &str, params: &str) -> String {
    if params.is_empty() {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Key names an SQL statement could take for SQL: quotes, comments, `LIKE` wildcards and
/// escapes, placeholders, spaces and case that a collation may ignore.
pub const HOSTILE_KEYS: &[&str] = &[
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
    // The last character there is: a prefix ending in it has no successor of the same
    // length (list_held's upper bound).
    "\u{10ffff}",
];

/// A private PostgreSQL server for the conformance suite.
pub const POSTGRES: ServerStore = ServerStore {
    name: "postgres",
    start: || Box::pin(start(StoreSpec::postgres)),
    url: |addrs, options| url_with(&postgres_url(addrs[0].port(), POSTGRES_PASSWORD), options),
    wrong_password: Some(|addrs, password| postgres_url(addrs[0].port(), password)),
    ..SERVER
};

/// A private MariaDB server for the conformance suite.
pub const MARIADB: ServerStore = ServerStore {
    name: "mysql",
    start: || Box::pin(start(StoreSpec::mariadb)),
    url: |addrs, options| url_with(&mariadb_url(addrs[0].port(), MARIADB_PASSWORD), options),
    wrong_password: Some(|addrs, password| mariadb_url(addrs[0].port(), password)),
    ..SERVER
};

/// What the SQL servers have in common.
const SERVER: ServerStore = ServerStore {
    name: "",
    start: || Box::pin(async { Err("no server".to_string()) }),
    url: |_, _| String::new(),
    connect: |url| Box::pin(async move { lock_sql::connect(&url).await }),
    // Not `connect`: unreachable-store scenarios are about lock calls to a database that
    // is gone.
    connect_lazily: Some(|url| {
        let backend = SqlBackend::new(lock_sql::SqlConfig::from_url(&url)?)?;
        Ok(Arc::new(backend) as DynBackend)
    }),
    link_options: "",
    unreachable_options: "",
    wrong_password: None,
    renewal_requests: None,
    // Each commit waits for its fsync, which stalled for more than the 170 ms a renewal
    // of a 400 ms lease had left on a loaded machine (PostgreSQL's renewal scenarios
    // failed now and then in CI). SQLite's factory is not a server's: it keeps 400 ms.
    shortest_ttl: Duration::from_secs(1),
    hostile_keys: HOSTILE_KEYS,
};

async fn start(spec: fn() -> StoreSpec) -> Result<Vec<StoreProcess>, String> {
    let server = StoreProcess::start(spec())
        .await
        .map_err(|e| e.to_string())?;
    Ok(vec![server])
}

fn postgres_url(port: u16, password: &str) -> String {
    format!("postgres://postgres:{password}@127.0.0.1:{port}/postgres?sslmode=disable")
}

fn mariadb_url(port: u16, password: &str) -> String {
    format!("mysql://{MARIADB_USER}:{password}@127.0.0.1:{port}/{MARIADB_DATABASE}")
}

/// SQLite has no server: clients of one file.
struct SqliteFactory {
    db: Database,
}

#[async_trait]
impl BackendFactory for SqliteFactory {
    fn name(&self) -> String {
        self.db.name.to_owned()
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        lock_sql::connect(&self.db.url).await
    }

    fn hostile_keys(&self) -> &'static [&'static str] {
        HOSTILE_KEYS
    }
}
