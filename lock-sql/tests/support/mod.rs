//! Shared by the lock-sql test targets and the SQL benchmark: private database servers
//! and conformance factories over them.
//!
//! PostgreSQL and MariaDB are started by the store-process fixture; when their binaries
//! are missing, setup fails (never skips).

// `unexpected_cfgs`: the SQL benchmark includes this module too, where lock-sql's
// features are not features (its servers' counters are then left out).
#![allow(dead_code, clippy::unwrap_used, unexpected_cfgs)]

use std::sync::Arc;

use conformance_tests::store_process::{
    StoreProcess, StoreSpec, MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER, POSTGRES_PASSWORD,
};
use conformance_tests::{BackendFactory, CountedStore, Failure, ServerStore};
use lock_core::backend::{async_trait, DynBackend};
use lock_sql::SqlBackend;
use std::time::Duration;

mod statements;

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
    renewal_requests: counters::POSTGRES,
    ..SERVER
};

/// A private MariaDB server for the conformance suite.
pub const MARIADB: ServerStore = ServerStore {
    name: "mysql",
    start: || Box::pin(start(StoreSpec::mariadb)),
    url: |addrs, options| url_with(&mariadb_url(addrs[0].port(), MARIADB_PASSWORD), options),
    wrong_password: Some(|addrs, password| mariadb_url(addrs[0].port(), password)),
    renewal_requests: counters::MARIADB,
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
    enable_auth: None,
    renewal_requests: None,
    // Each commit waits for its fsync, which stalled for more than the 170 ms a renewal
    // of a 400 ms lease had left on a loaded machine (PostgreSQL's renewal scenarios
    // failed now and then in CI). SQLite's factory is not a server's: it keeps 400 ms.
    shortest_ttl: Duration::from_secs(1),
    end_session: None,
    hostile_keys: HOSTILE_KEYS,
};

/// Requests that can renew leases, as the servers count them.
mod counters {
    use conformance_tests::factory::{BoxFuture, CountResult};
    use std::net::SocketAddr;

    type Counter = Option<fn(SocketAddr) -> BoxFuture<CountResult>>;

    /// `UPDATE` statements on the default lock table, counted by a statement-level
    /// trigger that the first call installs: the statistics views would not do, as each
    /// session flushes its counts to them only now and then.
    #[cfg(feature = "postgres")]
    pub const POSTGRES: Counter = Some(|server| {
        Box::pin(async move {
            use sqlx::Connection;
            let url = super::postgres_url(server.port(), super::POSTGRES_PASSWORD);
            let mut conn = sqlx::PgConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::raw_sql(include_str!("count_updates.sql"))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let count: i64 = sqlx::query_scalar("SELECT n FROM distlock_test_updates")
                .fetch_one(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            u64::try_from(count).map_err(|e| e.to_string())
        })
    });
    #[cfg(not(feature = "postgres"))]
    pub const POSTGRES: Counter = None;

    /// `UPDATE` statements the server ran (the batch joins a JSON table: a multi-table
    /// update), from its global status, which sums every session's at once.
    #[cfg(feature = "mysql")]
    pub const MARIADB: Counter = Some(|server| {
        Box::pin(async move {
            use sqlx::{Connection, Row};
            let url = super::mariadb_url(server.port(), super::MARIADB_PASSWORD);
            let mut conn = sqlx::MySqlConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            let rows = sqlx::query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_update', 'Com_update_multi')",
            )
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
            let mut total = 0;
            for row in rows {
                let value: String = row.try_get(1).map_err(|e| e.to_string())?;
                total += value.parse::<u64>().map_err(|e| format!("{value}: {e}"))?;
            }
            Ok(total)
        })
    });
    #[cfg(not(feature = "mysql"))]
    pub const MARIADB: Counter = None;
}

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

    fn counts_renewal_requests(&self) -> bool {
        true
    }

    async fn counted_store(&self) -> Option<Result<Box<dyn CountedStore>, Failure>> {
        Some(CountedSqlite::start().await.map_err(Failure))
    }

    fn process_url(&self) -> Option<String> {
        Some(self.db.url.clone())
    }
}

/// A SQLite database of its own whose lock table's `UPDATE` statements are counted.
struct CountedSqlite {
    /// Keeps the file.
    _db: Database,
    url: String,
    table: String,
}

impl CountedSqlite {
    async fn start() -> Result<Box<dyn CountedStore>, String> {
        let db = Database::sqlite().await?;
        // The count is by table name: the other scenarios use the default table.
        let table = "counted_locks".to_owned();
        statements::watch(&table)?;
        Ok(Box::new(CountedSqlite {
            url: db.url_with(&format!("table={table}")),
            _db: db,
            table,
        }))
    }
}

#[async_trait]
impl CountedStore for CountedSqlite {
    async fn connect(&self) -> lock_core::Result<DynBackend> {
        lock_sql::connect(&self.url).await
    }

    async fn renewal_requests(&self) -> Result<Vec<u64>, String> {
        Ok(vec![statements::updates(&self.table)?])
    }
}
