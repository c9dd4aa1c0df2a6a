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
//! // One node; for Redlock: "redis+redlock://h1:6379,h2:6379,h3:6379,h4:6379,h5:6379".
//! let backend = lock_redis::connect("redis://127.0.0.1:6379/0?key_prefix=myapp:").await?;
//! let client = LockClient::new(backend);
//! let guard = client.lock("invoice-42").ttl(Duration::from_secs(10)).await?;
//! println!("writing with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod backend;
mod config;
mod entry;
mod error;
mod keys;
mod node;
mod notify;
mod quorum;
mod redlock;
mod replicas;
mod sentinel;
mod shared;

use std::sync::Arc;

pub use backend::RedisBackend;
pub use config::{RedisConfig, Replicas};
pub use redlock::RedlockBackend;

/// This crate in a table of stores (the `distlock` facade's): the `redis://`,
/// `redis+redlock://` and `redis+sentinel://` schemes, and with the `tls` feature
/// `rediss://` and `rediss+redlock://`, connected with [`connect`].
pub const STORE: lock_core::backend::Store =
    lock_core::backend::Store::new("redis", SERVED, |url| Box::pin(connect(url)));

/// The schemes this build serves.
const SERVED: &[&str] = &[
    "redis",
    "redis+redlock",
    "redis+sentinel",
    #[cfg(feature = "tls")]
    "rediss",
    #[cfg(feature = "tls")]
    "rediss+redlock",
];

/// Connects to the store a URL names: a [`RedisBackend`] for `redis://`, `rediss://` and
/// `redis+sentinel://` (the primary Sentinel names), a [`RedlockBackend`] for
/// `redis+redlock://` and `rediss+redlock://` (see [`RedisConfig`] for the URL format and
/// options).
pub async fn connect(url: &str) -> lock_core::Result<lock_core::backend::DynBackend> {
    let config = RedisConfig::from_url(url)?;
    connect_with(&config).await
}

/// [`connect`] with a configuration built or adjusted in code.
pub async fn connect_with(
    config: &RedisConfig,
) -> lock_core::Result<lock_core::backend::DynBackend> {
    Ok(if config.is_redlock() {
        Arc::new(RedlockBackend::connect(config).await?)
    } else {
        Arc::new(RedisBackend::connect(config).await?)
    })
}
