//! PostgreSQL and MariaDB under faults: partitions longer than the TTL (through the TCP
//! fault proxy), a frozen server (SIGSTOP/SIGCONT), a server killed and restarted while
//! a lock is held; and the error kinds for refused credentials, unreachable servers and
//! malformed URLs. Servers are private instances started by each test.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::{eventually, within};
use lock_core::backend::LockBackend;
use lock_core::{AcquireOptions, ErrorKind, LockClient, LockKey};

mod raw_connection;
mod support;
use support::Database;

const TTL: Duration = Duration::from_millis(1000);
const SLACK: Duration = conformance_tests::SLACK;

fn client(backend: lock_core::backend::DynBackend) -> LockClient {
    LockClient::from_dyn(backend).with_defaults(AcquireOptions {
        ttl: TTL,
        request_timeout: Duration::from_millis(300),
        ..AcquireOptions::default()
    })
}

/// The holder is cut off by a silent partition longer than its TTL: its lost signal
/// fires, a rival takes the key over with a greater token, and once the partition heals
/// the old holder's release reports the loss and leaves the rival's lock intact.
async fn partition_longer_than_ttl(db: Database) {
    let proxy = TcpFaultProxy::start(db.server.as_ref().unwrap().addr())
        .await
        .unwrap();
    let holder = client(
        lock_sql::connect(&db.url_via(proxy.addr().port()))
            .await
            .unwrap(),
    );
    let rival = client(std::sync::Arc::new(db.backend().await));
    let key = format!("partition/{:x}", fastrand_u64());
    let guard = holder.lock(&key).await.unwrap();
    let old_token = guard.token();
    proxy.set_mode(ProxyMode::BlackHole);
    let cut_at = Instant::now();
    within(TTL + SLACK, "lost() during the partition", guard.lost())
        .await
        .unwrap();
    assert!(!guard.is_held());
    let taken = rival
        .lock(&key)
        .wait_up_to(TTL * 3)
        .await
        .expect("the rival takes the key over");
    assert!(
        cut_at.elapsed() >= TTL - TTL / 10,
        "taken over before the TTL ran out"
    );
    assert!(taken.token() > old_token, "takeover token did not grow");
    proxy.set_mode(ProxyMode::Pass);
    // The old holder's release goes through the healed proxy (its pool reconnects).
    let outcome = within(
        Duration::from_secs(10),
        "old holder's release",
        guard.release(),
    )
    .await
    .unwrap();
    assert!(
        outcome.as_ref().is_err_and(|e| e.kind() == ErrorKind::Lost),
        "the old holder's release claimed the lock: {outcome:?}"
    );
    let info = rival
        .backend()
        .inspect(&LockKey::new(&key).unwrap())
        .await
        .unwrap()
        .expect("rival still holds");
    assert_eq!(info.lease_id, taken.lease().id());
    taken.release().await.unwrap();
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

/// A frozen server makes a bounded lock attempt fail with a retryable "unavailable"
/// within its bound; once the server runs again, locking works.
async fn frozen_server(db: Database) {
    let locker = client(std::sync::Arc::new(db.backend().await));
    let key = format!("frozen/{:x}", fastrand_u64());
    let held = locker.lock(&key).await.unwrap();
    held.release().await.unwrap();
    db.server.as_ref().unwrap().pause().unwrap();
    let bound = Duration::from_millis(500);
    let started = Instant::now();
    let err = locker.lock(&key).wait_up_to(bound).await.unwrap_err();
    let waited = started.elapsed();
    db.server.as_ref().unwrap().resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(waited <= bound + SLACK, "gave up after {waited:?}");
    let guard = locker
        .lock(&key)
        .wait_up_to(Duration::from_secs(10))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

/// The server is killed without warning while a lock is held and restarted on the same
/// data: the lock is still there, and tokens issued after the restart are greater than
/// every token before it.
async fn killed_and_restarted(mut db: Database) {
    let key = format!("restart/{:x}", fastrand_u64());
    let before = {
        let locker = client(std::sync::Arc::new(db.backend().await));
        let mut last = locker.lock(&key).await.unwrap().token();
        for _ in 0..5 {
            let guard = locker.lock(format!("{key}/other")).await.unwrap();
            last = last.max(guard.token());
            guard.release().await.unwrap();
        }
        let held = locker
            .lock(format!("{key}/held"))
            .renewal(lock_core::Renewal::Manual)
            .ttl(Duration::from_secs(60))
            .await
            .unwrap();
        let held_token = held.token();
        std::mem::forget(held);
        db.server.as_mut().unwrap().kill().unwrap();
        (last.max(held_token), held_token)
    };
    db.server.as_mut().unwrap().restart().await.unwrap();
    let observer = db.backend().await;
    let locker = client(std::sync::Arc::new(observer.clone()));
    let info = eventually(
        Duration::from_secs(10),
        "the restarted server answers",
        || async { Ok(locker.inspect(format!("{key}/held")).await.is_ok()) },
    )
    .await;
    info.unwrap();
    let held_key = LockKey::new(format!("{key}/held")).unwrap();
    let held = observer
        .inspect(&held_key)
        .await
        .unwrap()
        .expect("the held lock survived the restart");
    assert_eq!(held.token, before.1);
    let after = locker.lock(format!("{key}/new")).await.unwrap();
    assert!(
        after.token() > before.0,
        "token {} after the restart is not above {} before it",
        after.token(),
        before.0
    );
    after.release().await.unwrap();
    observer.release(&held_key, held.lease_id).await.unwrap();
}

/// Wrong credentials are "permission denied", not retryable, and the password is not in
/// the error.
async fn wrong_password(db: Database, user: &str) {
    let port = db.server.as_ref().unwrap().port();
    let scheme = if db.name == "postgres" {
        "postgres"
    } else {
        "mysql"
    };
    let database = if db.name == "postgres" {
        "postgres"
    } else {
        "distlock"
    };
    let url = format!("{scheme}://{user}:not-the-password@127.0.0.1:{port}/{database}");
    let err = lock_sql::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err} ({err:?})");
    assert!(!err.is_retryable());
    assert!(!format!("{err} {err:?}").contains("not-the-password"));
}

/// Nothing listens: "unavailable" within the connect timeout.
async fn unreachable(db: Database) {
    let url = support::url_with(
        &db.url_via(support::closed_port()),
        "connect_timeout_ms=300",
    );
    let started = Instant::now();
    let err = lock_sql::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err} ({err:?})");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !format!("{err:?}").contains("distlock-test"),
        "password in {err:?}"
    );
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
    let port = support::closed_port();
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
    ($module:ident, $start:ident, $user:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn partition_longer_than_ttl() {
                super::partition_longer_than_ttl(Database::$start().await.unwrap()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn partition_swallowing_answers_frees_the_pool() {
                super::partition_swallowing_answers_frees_the_pool(
                    Database::$start().await.unwrap(),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn frozen_server() {
                super::frozen_server(Database::$start().await.unwrap()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_and_restarted() {
                super::killed_and_restarted(Database::$start().await.unwrap()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn wrong_password() {
                super::wrong_password(Database::$start().await.unwrap(), $user).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn unreachable() {
                super::unreachable(Database::$start().await.unwrap()).await;
            }
        }
    };
}

server_tests!(postgres, postgres, "postgres");
server_tests!(mariadb, mariadb, "distlock");
