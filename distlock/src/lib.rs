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
//! | `redis://`, `redis+redlock://`, `redis+sentinel://` | Redis, Redlock, Redis behind Sentinel (`lock-redis`) | `redis` (`rediss` with `redis-tls`) |
//! | `etcd://host:port[,host:port...][/prefix]` | etcd 3.4+ (`lock-etcd`) | `etcd` |
//! | `zk://host:port[,host:port...][/chroot]` | ZooKeeper 3.5+ (`lock-zk`) | `zookeeper` |

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod blocking;
mod readme;

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
use lock_core::backend::Store;
pub use lock_core::backend::{redact_url, redact_url_in};
/// Metric names and the tracing layer, the same for every store.
pub use lock_core::observe;
pub use lock_core::{
    AcquireOptions, Backoff, Capabilities, Error, ErrorKind, Execution, FencedResource,
    FencingToken, HoldKind, IdempotentRequest, Lease, LeaseHealth, LeaseId, Liveness, LockClient,
    LockGuard, LockKey, LockOwner, LockRequest, LockScope, LockSet, LockSetRequest, LockStatus,
    LossReason, MemoryBackend, OnceRequest, OnceTicket, Permit, Primitive, Renewal, Result,
    StaleToken, Wait,
};

/// A client for the store named by `url`.
///
/// `memory://NAME` is an in-process store: every `connect` with the same name in one
/// process shares it (an empty name is a store of its own). The other schemes are listed
/// in the crate docs. A scheme whose backend is not compiled in, or unknown, is
/// [`ErrorKind::InvalidInput`] naming the scheme; credentials in the URL never appear in
/// errors or logs.
pub async fn connect(url: &str) -> Result<LockClient> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{:?} is not a store URL (expected scheme://...)",
                redact_url(url)
            ),
        ));
    };
    match STORES.iter().find(|store| store.serves(scheme)) {
        Some(store) => Ok(LockClient::new(store.connect(url).await?)),
        None => Err(no_backend(&scheme.to_ascii_lowercase(), url)),
    }
}

/// The stores this build connects to: adding a store is one line here (and one in
/// [`SCHEMES`]).
const STORES: &[Store] = &[
    MEMORY,
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    lock_sql::STORE,
    #[cfg(feature = "redis")]
    lock_redis::STORE,
    #[cfg(feature = "etcd")]
    lock_etcd::STORE,
    #[cfg(feature = "zookeeper")]
    lock_zk::STORE,
];

/// `memory://NAME`, in-process stores shared by name.
const MEMORY: Store = Store::new("memory", &["memory"], |url| {
    let name = url.split_once("://").map_or("", |(_, name)| name);
    let store = named_memory_store(name);
    Box::pin(async move { Ok(std::sync::Arc::new(store) as backend::DynBackend) })
});

/// Every scheme distlock knows, the cargo feature of this crate that brings its backend
/// (what a build without it is told to turn on), and whether this build has it.
const SCHEMES: &[(&str, &str, bool)] = &[
    ("memory", "(always)", true),
    ("sqlite", "sqlite", cfg!(feature = "sqlite")),
    ("postgres", "postgres", cfg!(feature = "postgres")),
    ("postgresql", "postgres", cfg!(feature = "postgres")),
    ("mysql", "mysql", cfg!(feature = "mysql")),
    ("mariadb", "mysql", cfg!(feature = "mysql")),
    ("redis", "redis", cfg!(feature = "redis")),
    ("redis+redlock", "redis", cfg!(feature = "redis")),
    ("redis+sentinel", "redis", cfg!(feature = "redis")),
    ("rediss", "redis-tls", cfg!(feature = "redis-tls")),
    ("rediss+redlock", "redis-tls", cfg!(feature = "redis-tls")),
    ("etcd", "etcd", cfg!(feature = "etcd")),
    ("zk", "zookeeper", cfg!(feature = "zookeeper")),
];

/// The URL schemes this build of distlock can connect to.
pub fn supported_schemes() -> Vec<&'static str> {
    STORES
        .iter()
        .flat_map(|store| store.schemes())
        .copied()
        .collect()
}

/// Why this build cannot connect to `scheme`: the feature it lacks, or an unknown scheme.
fn no_backend(scheme: &str, url: &str) -> Error {
    let why = match SCHEMES.iter().find(|(known, _, _)| *known == scheme) {
        Some((_, feature, _)) => format!(
            "scheme {scheme:?} needs distlock's `{feature}` cargo feature, which this build \
             lacks (or, for the CLI, `cargo install distlock-cli --features {feature}`)"
        ),
        None => format!("unknown scheme {scheme:?}"),
    };
    Error::new(
        ErrorKind::InvalidInput,
        format!(
            "{why} in {:?}; this build supports: {}",
            redact_url(url),
            supported_schemes().join(", ")
        ),
    )
}

fn named_memory_store(name: &str) -> MemoryBackend {
    if name.is_empty() {
        return MemoryBackend::new();
    }
    static STORES: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    let mut stores = backend::lock_unpoisoned(STORES.get_or_init(Mutex::default));
    stores.entry(name.to_string()).or_default().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The facade's table knows every scheme of every store compiled in, and says of each
    /// whether this build serves it (the stores list what their features built).
    #[test]
    fn every_store_scheme_is_in_the_table() {
        for scheme in supported_schemes() {
            assert!(
                SCHEMES
                    .iter()
                    .any(|(known, _, built)| *known == scheme && *built),
                "{scheme} is missing from the facade's table"
            );
        }
        // `connect` takes the first store serving a scheme: a second would never be used.
        let schemes = supported_schemes();
        for scheme in &schemes {
            let serving = schemes.iter().filter(|other| *other == scheme).count();
            assert_eq!(serving, 1, "{scheme} is served by {serving} stores");
        }
    }

    /// A scheme whose backend this build lacks is refused naming the facade's feature,
    /// and only what is built in is listed as supported.
    #[tokio::test]
    async fn a_missing_backend_names_the_feature_to_turn_on() {
        for (scheme, feature, built) in SCHEMES {
            assert_eq!(supported_schemes().contains(scheme), *built, "{scheme}");
            if *built {
                continue;
            }
            let err = connect(&format!("{scheme}://u:hunter2@127.0.0.1:1/x"))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            let text = err.to_string();
            assert!(text.contains(&format!("`{feature}`")), "{text}");
            assert!(
                !text.contains("lock-sql") && !text.contains("hunter2"),
                "{text}"
            );
        }
    }

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
