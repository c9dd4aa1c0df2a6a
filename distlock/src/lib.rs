//! Distributed locks with fencing tokens, one contract over many stores.
//!
//! Depend on `distlock`, pick a store with a cargo feature or a URL, and lock:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! use std::time::Duration;
//!
//! let client = distlock::connect("memory://example").await?;
//! let guard = client.lock("invoices/2026-11").ttl(Duration::from_secs(10)).await?;
//! println!("holding {} with fencing token {}", guard.key(), guard.token());
//! // Pass the token to whatever the lock protects; a stale holder's token is refused.
//! // A lease lost before the release is an error the caller has to handle.
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Every backend passes the same conformance suite; the guarantees and the scenario that
//! proves each one are listed in the repository's `docs/contract.md`. Backends, each
//! behind a cargo feature of this crate:
//!
//! | URL scheme | backend | feature |
//! |---|---|---|
//! | `memory://NAME` | in-process reference backend ([`MemoryBackend`]) | always |
//! | `sqlite://PATH` | SQLite file, no server (`lock-sql`) | `sqlite` (default) |
//! | `postgres://`, `postgresql://` | PostgreSQL (`lock-sql`) | `postgres` |
//! | `mysql://`, `mariadb://` | MariaDB 10.5+ (`lock-sql`) | `mysql` |
//! | `redis://`, `redis+redlock://` | Redis, Redlock (`lock-redis`) | `redis` (`rediss` with `redis-tls`) |
//! | `etcd://host:port[,host:port...][/prefix]` | etcd 3.4+ (`lock-etcd`) | `etcd` |
//! | `zk://host:port[,host:port...][/chroot]` | ZooKeeper 3.5+ (`lock-zk`) | `zookeeper` |

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use lock_sql;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use lock_redis;

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use lock_etcd;

#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use lock_zk;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub use lock_core::backend;
pub use lock_core::{
    default_drift_allowance, redact_url, AcquireOptions, Backoff, Capabilities, Error, ErrorKind,
    Execution, FencedResource, FencingToken, IdempotentRequest, Lease, LeaseId, Liveness,
    LockClient, LockGuard, LockKey, LockOwner, LockRequest, LockScope, LockStatus, MemoryBackend,
    MemoryLink, OnceRequest, OnceTicket, Renewal, Result, StaleToken, Wait, DEFAULT_RETENTION,
};

/// A client for the store named by `url`.
///
/// `memory://NAME` is an in-process store: every `connect` with the same name in one
/// process shares it (an empty name is a store of its own). The other schemes are listed
/// in the crate docs. A scheme whose backend is not compiled in, or unknown, is
/// [`ErrorKind::InvalidInput`] naming the scheme; credentials in the URL never appear in
/// errors or logs.
pub async fn connect(url: &str) -> Result<LockClient> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{:?} is not a store URL (expected scheme://...)",
                redact_url(url)
            ),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "memory" {
        return Ok(LockClient::new(named_memory_store(rest)));
    }
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    if lock_sql::SCHEMES.contains(&scheme.as_str()) {
        return Ok(LockClient::from_dyn(lock_sql::connect(url).await?));
    }
    #[cfg(feature = "redis")]
    if lock_redis::SCHEMES.contains(&scheme.as_str()) {
        return Ok(LockClient::from_dyn(lock_redis::connect(url).await?));
    }
    #[cfg(feature = "etcd")]
    if lock_etcd::SCHEMES.contains(&scheme.as_str()) {
        return Ok(LockClient::from_dyn(lock_etcd::connect(url).await?));
    }
    #[cfg(feature = "zookeeper")]
    if lock_zk::SCHEMES.contains(&scheme.as_str()) {
        return Ok(LockClient::from_dyn(lock_zk::connect(url).await?));
    }
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!(
            "no backend for scheme {scheme:?} in {:?}; this build supports: {}",
            redact_url(url),
            supported_schemes().join(", ")
        ),
    ))
}

/// The URL schemes this build of distlock can connect to.
pub fn supported_schemes() -> Vec<&'static str> {
    let sql: &[&str] = {
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        {
            lock_sql::SCHEMES
        }
        #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
        {
            &[]
        }
    };
    let redis: &[&str] = {
        #[cfg(feature = "redis")]
        {
            lock_redis::SCHEMES
        }
        #[cfg(not(feature = "redis"))]
        {
            &[]
        }
    };
    let etcd: &[&str] = {
        #[cfg(feature = "etcd")]
        {
            lock_etcd::SCHEMES
        }
        #[cfg(not(feature = "etcd"))]
        {
            &[]
        }
    };
    let zookeeper: &[&str] = {
        #[cfg(feature = "zookeeper")]
        {
            lock_zk::SCHEMES
        }
        #[cfg(not(feature = "zookeeper"))]
        {
            &[]
        }
    };
    [&["memory"], sql, redis, etcd, zookeeper].concat()
}

fn named_memory_store(name: &str) -> MemoryBackend {
    if name.is_empty() {
        return MemoryBackend::new();
    }
    static STORES: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    stores.entry(name.to_string()).or_default().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn named_memory_stores_are_shared() {
        let a = connect("memory://shared-test").await.unwrap();
        let b = connect("memory://shared-test").await.unwrap();
        let guard = a.lock("k").await.unwrap();
        assert_eq!(
            b.try_lock("k").await.unwrap_err().kind(),
            ErrorKind::HeldByAnother
        );
        guard.release().await.unwrap();
        let other = connect("memory://").await.unwrap();
        other.try_lock("k").await.unwrap().release().await.unwrap();
    }

    #[tokio::test]
    async fn bad_urls_are_invalid_input_without_secrets() {
        let err = connect("nosuchstore://user:hunter2@127.0.0.1:1/0")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("nosuchstore"), "{err}");
        assert!(
            err.to_string().contains("memory"),
            "lists what is supported: {err}"
        );
        assert_eq!(
            connect("nonsense").await.unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // Unencoded reserved characters in a password: refused, never echoed.
        for url in [
            "nosuch://u:Zq7x/yz@h",
            "nosuch://u:Zq7x?yz@h",
            "nosuch://u:Zq7x#yz@h",
            "nosuch://u:Zq7x@yz@h",
            "u:Zq7x/yz@h",
        ] {
            let err = connect(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
            let shown = format!("{err} {err:?}");
            assert!(
                !shown.contains("Zq7x") && !shown.contains("yz"),
                "{url}: {shown}"
            );
        }
    }

    #[tokio::test]
    async fn schemes_are_case_insensitive() {
        let client = connect("MEMORY://case-test").await.unwrap();
        client.try_lock("k").await.unwrap().release().await.unwrap();
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_urls_reach_lock_sql() {
        let dir = std::env::temp_dir().join(format!("distlock-facade-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("locks.db").display());
        let (a, b) = (connect(&url).await.unwrap(), connect(&url).await.unwrap());
        let guard = a.lock("k").await.unwrap();
        assert_eq!(
            b.try_lock("k").await.unwrap_err().kind(),
            ErrorKind::HeldByAnother
        );
        guard.release().await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
