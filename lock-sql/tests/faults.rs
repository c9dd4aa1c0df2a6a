//! SQL-specific faults: a partition that swallows the answers of every pooled connection,
//! malformed URLs, and passwords in URLs. Partitions, freezes, restarts, refused
//! credentials and unreachable servers in general are conformance scenarios.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::within;
use lock_core::{AcquireOptions, ErrorKind, LockClient};

mod raw_connection;
mod support;
use support::Database;

const TTL: Duration = Duration::from_millis(1000);

fn client(backend: lock_core::backend::DynBackend) -> LockClient {
    LockClient::new(backend).with_defaults(AcquireOptions {
        ttl: TTL,
        request_timeout: Duration::from_millis(300),
        ..AcquireOptions::default()
    })
}

/// Statements whose answers a partition swallows must not keep their pool connections:
/// every connection of the holder's pool is busy with an acquire (waiting for rows
/// another transaction is inserting) when a black hole opens; the callers give up, the
/// partition heals, and locking through the same backend works again at once, twenty
/// times in a row, instead of finding the pool exhausted for ever.
async fn partition_swallowing_answers_frees_the_pool(db: Database) {
    const POOL: usize = 3;
    let proxy = TcpFaultProxy::start(db.server.as_ref().unwrap().addr())
        .await
        .unwrap();
    let url = support::url_with(
        &db.url_via(proxy.addr().port()),
        &format!("pool_size={POOL}&statement_timeout_ms=1000&connect_timeout_ms=1000"),
    );
    let holder = client(lock_sql::connect(&url).await.unwrap());
    let prefix = format!("swallowed/{:x}", fastrand_u64());
    let mut other = raw_connection::RawConnection::open(&db).await;
    other.run("BEGIN").await;
    for n in 0..POOL {
        other
            .run(&format!(
                "INSERT INTO distlock_locks (lock_key, lease_id, token, expires_at) \
                 VALUES ('{prefix}/{n}', '{}', 1, 0)",
                lock_core::LeaseId::random()
            ))
            .await;
    }
    let attempts: Vec<_> = (0..POOL)
        .map(|n| {
            let holder = holder.clone();
            let key = format!("{prefix}/{n}");
            tokio::spawn(async move { holder.try_lock(&key).await.map(drop) })
        })
        .collect();
    raw_connection::RawConnection::wait_for_lock_waits(&db, POOL).await;
    proxy.set_mode(ProxyMode::BlackHole);
    other.run("ROLLBACK").await;
    for attempt in attempts {
        let outcome = within(
            Duration::from_secs(5),
            "an attempt in the partition",
            attempt,
        )
        .await
        .unwrap()
        .unwrap();
        assert!(outcome.is_err(), "an answer crossed the black hole");
    }
    proxy.set_mode(ProxyMode::Pass);
    let key = format!("{prefix}/after");
    for round in 0..20 {
        let guard = within(
            Duration::from_secs(6),
            &format!("lock/release cycle {round} after the partition"),
            holder.lock(&key).wait_up_to(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("cycle {round}: {err}"));
        guard.release().await.unwrap();
    }
}

fn fastrand_u64() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    (nanos as u64) ^ u64::from(std::process::id())
}

#[test]
fn malformed_urls_are_invalid_input() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for url in [
        "postgres//nohost",
        "ftp://x/y",
        "postgres://u:secret@127.0.0.1:notaport/db",
        "mysql://u:secret@127.0.0.1:1/db?table=x;drop",
        "sqlite://:memory:",
    ] {
        let err = runtime.block_on(lock_sql::connect(url)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        assert!(!format!("{err} {err:?}").contains("secret"), "{err:?}");
    }
}

/// Passwords with reserved characters (percent-encoded, as the docs require) or given as
/// `?password=` never show in a backend's or client's `Debug`, nor in the errors of a
/// connection that fails; generated ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_show() {
    let port = conformance_tests::network::closed_addr().unwrap().port();
    let mut rng = fastrand::Rng::with_seed(0x9a55);
    let mut passwords = vec!["p#ss/w?rd@x".to_owned(), "hunter2".to_owned()];
    passwords.extend((0..8).map(|_| {
        let tail: String = (0..10)
            .map(|_| ['a', '/', '?', '#', '@', ':', '%', '&', ' ', 'é'][rng.usize(..10)])
            .collect();
        format!("Zq7{tail}")
    }));
    for password in passwords {
        let encoded =
            percent_encoding::utf8_percent_encode(&password, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        for url in [
            format!("postgres://u:{encoded}@127.0.0.1:{port}/db"),
            format!("postgres://u@127.0.0.1:{port}/db?password={encoded}"),
            format!("mysql://u:{encoded}@127.0.0.1:{port}/db"),
        ] {
            let url = support::url_with(&url, "connect_timeout_ms=200");
            let config = lock_sql::SqlConfig::from_url(&url).unwrap();
            let backend = lock_sql::SqlBackend::new(config).unwrap();
            let client = LockClient::new(backend.clone());
            let err = lock_sql::connect(&url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
            let text = format!(
                "{backend:?} {client:?} {}",
                conformance_tests::everything_shown(&err)
            );
            for secret in [&password, &encoded] {
                assert!(
                    !text.contains(secret.as_str()),
                    "{secret:?} shown in {text}"
                );
            }
        }
    }
}

macro_rules! server_tests {
    ($module:ident, $start:ident) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn partition_swallowing_answers_frees_the_pool() {
                super::partition_swallowing_answers_frees_the_pool(
                    Database::$start().await.unwrap(),
                )
                .await;
            }
        }
    };
}

server_tests!(postgres, postgres);
server_tests!(mariadb, mariadb);
