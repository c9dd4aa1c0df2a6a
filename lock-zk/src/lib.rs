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
//! let backend = lock_zk::connect("zk://127.0.0.1:2181/myapp?min_ttl_ms=4000&max_ttl_ms=40000").await?;
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
mod session;
mod shared;
mod watch;

use std::sync::Arc;

pub use backend::ZkBackend;
pub use config::ZkConfig;
pub use keys::Layout;

/// This crate in a table of stores (the `distlock` facade's): the `zk://` scheme,
/// connected with [`connect`].
pub const STORE: lock_core::backend::Store =
    lock_core::backend::Store::new("zookeeper", config::SCHEMES, |url| Box::pin(connect(url)));

/// Connects to the ZooKeeper ensemble a `zk://` URL names (see [`ZkConfig`] for the URL
/// format and options).
pub async fn connect(url: &str) -> lock_core::Result<lock_core::backend::DynBackend> {
    let config = ZkConfig::from_url(url)?;
    connect_with(&config).await
}

/// [`connect`] with a configuration built or adjusted in code.
pub async fn connect_with(config: &ZkConfig) -> lock_core::Result<lock_core::backend::DynBackend> {
    Ok(Arc::new(ZkBackend::connect(config).await?))
}
