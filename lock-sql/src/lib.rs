//! distlock on SQL databases: SQLite as the embedded default (processes on one machine
//! coordinate through one database file, no server needed), PostgreSQL and MariaDB.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::LockClient;
//!
//! let backend = lock_sql::connect("sqlite:///tmp/distlock-example.db").await?;
//! let client = LockClient::new(backend);
//! let guard = client.lock("nightly-report").ttl(Duration::from_secs(30)).await?;
//! println!("holding the report lock with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Each dialect sits behind a cargo feature: `sqlite` (default), `postgres`, `mysql`.
//! How the lease table works, how fencing tokens are made and what each dialect
//! guarantees is documented on [`SqlBackend`]. Every dialect keeps semaphores and
//! reader-writer locks too (`client.semaphore`, `read_lock`, `write_lock`), in a table
//! beside the lock table; waiting for them is not fair, except that a waiting writer keeps
//! new readers out ([`SqlBackend`], "Semaphores and reader-writer locks").

mod backend;
mod config;
mod dialect;
mod error;

pub use backend::SqlBackend;
pub use config::{Dialect, SqlConfig, SqliteSynchronous};

/// This crate in a table of stores (the `distlock` facade's): the schemes of the dialects
/// this build has (`sqlite`, `postgres` and `postgresql`, `mysql` and `mariadb`),
/// connected with [`connect`].
pub const STORE: lock_core::backend::Store =
    lock_core::backend::Store::new("sql", SERVED, |url| Box::pin(connect(url)));

/// The schemes this build serves: those of the dialects whose feature is on.
const SERVED: &[&str] = &[
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "postgres")]
    "postgresql",
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
];

/// Connects to the database `url` names and creates the lock table if missing.
///
/// `sqlite:///abs/path.db` or `sqlite://relative.db` (the file is created if missing),
/// `postgres://` / `postgresql://`, `mysql://` / `mariadb://`; the query may set `table`,
/// `pool_size`, `connect_timeout_ms`, `statement_timeout_ms` and, for SQLite,
/// `synchronous` (see [`SqlConfig`]). Reserved characters in the password must be
/// percent-encoded. A malformed URL is
/// [`InvalidInput`](lock_core::ErrorKind::InvalidInput), an unreachable database
/// [`Unavailable`](lock_core::ErrorKind::Unavailable), refused credentials
/// [`PermissionDenied`](lock_core::ErrorKind::PermissionDenied), a missing database or a
/// table of another shape [`Misconfigured`](lock_core::ErrorKind::Misconfigured).
///
/// Every backend crate connects the same way: [`STORE`], `connect(url)` and
/// [`connect_with`] for a configuration built in code, each giving a shareable backend.
pub async fn connect(url: &str) -> lock_core::Result<lock_core::backend::DynBackend> {
    connect_with(&SqlConfig::from_url(url)?).await
}

/// [`connect`] with a configuration built or adjusted in code.
pub async fn connect_with(config: &SqlConfig) -> lock_core::Result<lock_core::backend::DynBackend> {
    Ok(std::sync::Arc::new(
        SqlBackend::connect(config.clone()).await?,
    ))
}
