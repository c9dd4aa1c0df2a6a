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
use conformance_tests::BackendFactory;
use lock_core::{async_trait, backend::DynBackend};
use lock_sql::SqlBackend;

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
            format!(
                "postgres://postgres:{POSTGRES_PASSWORD}@127.0.0.1:{port}/postgres?sslmode=disable"
            )
        })
        .await
    }

    pub async fn mariadb() -> Result<Self, String> {
        Self::server(StoreSpec::mariadb(), "mysql", |port| {
            format!("mysql://{MARIADB_USER}:{MARIADB_PASSWORD}@127.0.0.1:{port}/{MARIADB_DATABASE}")
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

    /// A conformance factory over this database (taking ownership of it).
    pub async fn into_factory(self) -> Result<Arc<dyn BackendFactory>, String> {
        let observer = SqlBackend::connect(
            lock_sql::SqlConfig::from_url(&self.url).map_err(|e| format!("{}: {e}", self.name))?,
        )
        .await
        .map_err(|e| format!("connecting to {}: {e}", self.name))?;
        Ok(Arc::new(SqlFactory { db: self, observer }))
    }
}

pub fn url_with(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A port on 127.0.0.1 nothing listens on.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

struct SqlFactory {
    db: Database,
    observer: SqlBackend,
}

#[async_trait]
impl BackendFactory for SqlFactory {
    fn name(&self) -> String {
        self.db.name.to_owned()
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        Ok(Arc::new(lock_sql::connect(&self.db.url).await?))
    }

    async fn residue(&self, prefix: &str) -> lock_core::Result<Vec<String>> {
        self.observer.stored_keys(prefix).await
    }

    async fn connect_unreachable(&self) -> Option<lock_core::Result<DynBackend>> {
        self.db.server.as_ref()?;
        let url = url_with(&self.db.url_via(closed_port()), "connect_timeout_ms=300");
        let config = match lock_sql::SqlConfig::from_url(&url) {
            Ok(config) => config,
            Err(err) => return Some(Err(err)),
        };
        // Not `connect`: the scenario is about lock calls to a database that is gone.
        Some(SqlBackend::new(config).map(|b| Arc::new(b) as DynBackend))
    }
}
