#![doc = include_str!("../docs.md")]
//!
//! # Example
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::LockClient;
//!
//! // Every member of the cluster; the path is the namespace of this application's locks.
//! let backend = lock_etcd::connect("etcd://127.0.0.1:2379,127.0.0.1:22379/myapp").await?;
//! let client = LockClient::new(backend);
//! let guard = client.lock("invoice-42").ttl(Duration::from_secs(10)).await?;
//! println!("writing with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod backend;
mod config;
mod detached;
mod error;
mod keys;
mod records;
mod retired;
mod server;
mod session;
mod shared;
mod watch;

use std::sync::Arc;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, Layout};

/// This crate in a table of stores (the `distlock` facade's): the `etcd://` scheme,
/// connected with [`connect`].
pub const STORE: lock_core::backend::Store =
    lock_core::backend::Store::new("etcd", config::SCHEMES, |url| Box::pin(connect(url)));

/// Connects to the etcd cluster a URL names (see [`EtcdConfig`] for the URL format and
/// options).
pub async fn connect(url: &str) -> lock_core::Result<lock_core::backend::DynBackend> {
    let config = EtcdConfig::from_url(url)?;
    connect_with(&config).await
}

/// [`connect`] with a configuration built or adjusted in code.
pub async fn connect_with(
    config: &EtcdConfig,
) -> lock_core::Result<lock_core::backend::DynBackend> {
    Ok(Arc::new(EtcdBackend::connect(config).await?))
}
