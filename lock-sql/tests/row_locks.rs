//! The lock statements when they wait for database locks held by another transaction:
//! a grant that waited longer than its TTL is not written already over, tokens follow the
//! order of grants (a takeover draws its token under the row lock, a stalled insert keeps
//! its turn), a retried grant or a renewal never shortens the expiry, the MariaDB sweep
//! does not wait for locks on live rows, and an acquisition abandoned while its statement
//! waits leaves no hold once the statement ends.
//!
//! The other transaction is a plain sqlx connection of the test's own; where the test
//! waits for a statement to be blocked, it watches the server's lock tables.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::{eventually, within, Failure, FaultyBackend, Op, SLACK};
use lock_core::backend::{AcquireRequest, LockBackend};
use lock_core::{AcquireOptions, ErrorKind, FencingToken, LeaseId, LockClient, LockKey, Renewal};
use sqlx::Row;

mod raw_connection;
mod support;
use raw_connection::RawConnection;
use support::Database;

const TTL: Duration = Duration::from_millis(100);
/// How long the other transaction holds its lock: well past the TTL.
const HOLD: Duration = Duration::from_millis(400);
const DRIFT: Duration = Duration::from_millis(1);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}/{}", LeaseId::random())).unwrap()
}

fn request(key: &LockKey, ttl: Duration, lease: LeaseId) -> AcquireRequest {
    AcquireRequest::new(key.clone(), ttl, DRIFT, Renewal::Manual).with_lease_id(lease)
}

/// One acquisition attempt in a task of its own (it may wait on a lock the test holds).
fn spawn_attempt(
    backend: &lock_sql::SqlBackend,
    key: &LockKey,
    ttl: Duration,
    lease: LeaseId,
) -> tokio::task::JoinHandle<lock_core::Result<Option<FencingToken>>> {
    let (backend, request) = (backend.clone(), request(key, ttl, lease));
    tokio::spawn(async move { attempt(&backend, &request).await })
}

/// One acquisition attempt, answering the granted token.
async fn attempt(
    backend: &impl LockBackend,
    request: &AcquireRequest,
) -> lock_core::Result<Option<FencingToken>> {
    Ok(backend
        .try_acquire(request)
        .await?
        .map(|grant| grant.token()))
}

/// Waits until a statement waits for a lock; returns its server process id (PostgreSQL).
async fn blocked_session(db: &Database) -> i64 {
    RawConnection::wait_for_lock_waits(db, 1).await;
    let mut observer = RawConnection::observer(db).await;
    let sql = match db.name {
        "postgres" => "SELECT pid::bigint FROM pg_locks WHERE NOT granted LIMIT 1",
        _ => "SELECT 0",
    };
    observer.fetch_i64(sql).await.unwrap()
}

/// Another transaction holds the key's row (an uncommitted row of an expired lease)
/// for longer than the TTL while an acquire waits for it: the grant's expiry counts from
/// when it was written, so the lease is live when the grant returns (and the grant is
/// not refused as over already).
async fn grant_after_a_long_lock_wait_is_not_born_expired(db: Database) {
    let backend = db.backend().await;
    let key = key("long-wait");
    let mut other = RawConnection::open(&db).await;
    other.run("BEGIN").await;
    insert_expired_row(&mut other, &key, "1").await;
    let lease = LeaseId::random();
    let attempt = spawn_attempt(&backend, &key, TTL, lease);
    blocked_session(&db).await;
    let held_from = Instant::now();
    tokio::time::sleep(HOLD).await;
    other.run("COMMIT").await;
    let granted = within(Duration::from_secs(5), "the acquire", attempt)
        .await
        .unwrap()
        .unwrap();
    assert!(held_from.elapsed() >= HOLD);
    granted
        .expect("the grant after the wait")
        .expect("the expired row was taken over");
    let info = backend
        .inspect(&key)
        .await
        .unwrap()
        .expect("a grant returned after a long lock wait was already expired");
    assert_eq!(info.lease_id, lease);
    let _ = backend.release(&key, lease).await.unwrap();
}

/// MariaDB's insert of a new key waits for the token counter (another transaction holds
/// it longer than the TTL): the grant is either live when it returns or refused as
/// unanswered, never handed out expired.
async fn grant_after_a_long_counter_wait_is_not_handed_out_expired(db: Database) {
    let backend = db.backend().await;
    let key = key("counter-wait");
    let mut other = RawConnection::open(&db).await;
    other.run("BEGIN").await;
    other
        .run("UPDATE distlock_locks_tokens SET last_token = last_token WHERE id = 1")
        .await;
    let lease = LeaseId::random();
    let attempt = spawn_attempt(&backend, &key, TTL, lease);
    blocked_session(&db).await;
    tokio::time::sleep(HOLD).await;
    other.run("COMMIT").await;
    let granted = within(Duration::from_secs(5), "the acquire", attempt)
        .await
        .unwrap()
        .unwrap();
    match granted {
        Ok(Some(_)) => {
            let info = backend.inspect(&key).await.unwrap();
            assert!(
                info.is_some_and(|info| info.lease_id == lease),
                "a grant was handed out already expired"
            );
        }
        Err(err) => assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}"),
        Ok(None) => panic!("a free key was not granted"),
    }
    let _ = backend.release(&key, lease).await.unwrap();
}

/// PostgreSQL: an acquire waits for the row of an expired lease while, under that row's
/// lock, a rival's grant is written with a token drawn after the waiting statement
/// started (and an expiry already past: a stalled writer). The waiting acquire then takes
/// the row over; its token must be drawn under the row lock, so it is greater.
async fn takeover_token_is_drawn_under_the_row_lock(db: Database) {
    let backend = db.backend().await;
    let key = key("token-order");
    let mut setup = RawConnection::open(&db).await;
    insert_expired_row(&mut setup, &key, "nextval('distlock_locks_tokens')").await;
    let mut rival = lock_row(&db, &key).await;
    let lease = LeaseId::random();
    let attempt = spawn_attempt(&backend, &key, Duration::from_secs(30), lease);
    blocked_session(&db).await;
    let RawConnection::Postgres(conn) = &mut rival else {
        unreachable!()
    };
    let rival_token: i64 = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE distlock_locks SET lease_id = '{}', token = nextval('distlock_locks_tokens'), \
         expires_at = 0 WHERE lock_key = '{}' RETURNING token",
        LeaseId::random(),
        key.as_str()
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap()
    .get(0);
    rival.run("COMMIT").await;
    let token = within(Duration::from_secs(5), "the acquire", attempt)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("the expired row was taken over");
    assert!(
        token.get() > rival_token as u64,
        "takeover token {token:?} is not above the rival's {rival_token}, granted before it"
    );
    let _ = backend.release(&key, lease).await.unwrap();
}

/// A retried grant of the same lease with a shorter TTL (an older attempt landing after
/// a newer one), and a renewal with a shorter TTL, leave the longer expiry in place.
async fn regrant_and_renewal_never_shorten_the_expiry(db: Database) {
    let backend = db.backend().await;
    let key = key("never-shorter");
    let lease = LeaseId::random();
    let long = Duration::from_secs(60);
    let first = attempt(&backend, &request(&key, long, lease))
        .await
        .unwrap()
        .unwrap();
    let again = attempt(&backend, &request(&key, Duration::from_millis(50), lease))
        .await
        .unwrap();
    assert_eq!(
        again,
        Some(first),
        "a retry of the same lease keeps its token"
    );
    let remaining = |info: Option<lock_core::backend::HolderInfo>| info.unwrap().remaining_ttl;
    let left = remaining(backend.inspect(&key).await.unwrap());
    assert!(
        left > long / 2,
        "the re-grant shortened the expiry to {left:?}"
    );
    assert!(backend
        .renew(&key, lease, Duration::from_millis(50))
        .await
        .unwrap()
        .is_held());
    let left = remaining(backend.inspect(&key).await.unwrap());
    assert!(
        left > long / 2,
        "the renewal shortened the expiry to {left:?}"
    );
    assert!(backend.release(&key, lease).await.unwrap().is_held());
}

/// An acquisition is given up while its statement waits for the key's row, locked by
/// another transaction for longer than the request time-out. Both of the core's clean-up
/// releases (at once, and a request time-out later) are sent while the statement still
/// waits; the statement then takes the row over for the abandoned lease. The key must be
/// free as soon as that grant is written, not when its TTL runs out: a release waits for
/// the acquire statements of its lease still running (the in-flight gate, see docs.md).
async fn acquire_abandoned_in_a_row_lock_wait_leaves_nothing_held(db: Database) {
    let key = key("abandoned-in-lock-wait");
    // Connected first: connecting creates the table, which waits for an open transaction.
    let observer = db.backend().await;
    let faulty = FaultyBackend::new(Arc::new(db.backend().await));
    let mut setup = RawConnection::open(&db).await;
    insert_expired_row(&mut setup, &key, "1").await;
    let mut other = lock_row(&db, &key).await;
    // Short: on MariaDB the abandoned statement gives up on the row after one second (its
    // lock wait time-out), and both clean-up releases must be sent well before that.
    let request_timeout = Duration::from_millis(150);
    let client = LockClient::new(faulty.clone()).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(60),
        request_timeout,
        ..AcquireOptions::default()
    });
    let abandoned = within(
        Duration::from_secs(5),
        "the try-lock",
        client.try_lock(key.as_str()),
    )
    .await
    .unwrap();
    let err = abandoned.map(|guard| guard.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    eventually(
        request_timeout + SLACK * 2,
        "both clean-up releases are sent",
        || async { Ok(faulty.calls(Op::Release) >= 2) },
    )
    .await
    .unwrap();
    // The abandoned statement still waits for the row.
    RawConnection::wait_for_lock_waits(&db, 1).await;
    other.run("COMMIT").await;
    // The expired row is gone only if the abandoned statement took it over and was then
    // released.
    eventually(SLACK, "the abandoned grant is released", || async {
        Ok(observer.stored_keys(key.as_str()).await?.is_empty())
    })
    .await
    .unwrap();
}

/// Another transaction holds the row of a key a live lease holds, for longer than the
/// request time-out (a writer of that row that stalls). A contended acquire must not wait
/// out that row lock: a try-lock answers `HeldByAnother` well within the request
/// time-out, and a bounded wait ends as `TimedOut` at its bound, not as `Unavailable`
/// after a request time-out spent waiting on the row.
async fn contended_acquire_does_not_wait_out_a_row_lock(db: Database) {
    let backend = db.backend().await;
    let key = key("row-locked");
    let holder = LeaseId::random();
    backend
        .try_acquire(&request(&key, Duration::from_secs(60), holder))
        .await
        .unwrap()
        .unwrap();
    // Connected first: connecting creates the table, which waits for an open transaction.
    let contender = db.backend().await;
    let mut other = lock_row(&db, &key).await;
    let request_timeout = Duration::from_secs(2);
    let client = LockClient::new(contender).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(10),
        request_timeout,
        ..AcquireOptions::default()
    });
    let started = Instant::now();
    let tried = within(
        Duration::from_secs(5),
        "the try-lock",
        client.try_lock(key.as_str()),
    )
    .await
    .unwrap();
    let err = tried.map(|guard| guard.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
    assert!(
        started.elapsed() < request_timeout,
        "the try-lock took {:?}",
        started.elapsed()
    );
    let wait = Duration::from_secs(3);
    let started = Instant::now();
    let waited = within(
        wait + Duration::from_secs(5),
        "the bounded wait",
        client.lock(key.as_str()).wait_up_to(wait),
    )
    .await
    .unwrap();
    let err = waited.map(|guard| guard.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(
        started.elapsed() < wait + SLACK,
        "the wait of {wait:?} ended after {:?}",
        started.elapsed()
    );
    other.run("COMMIT").await;
    // The wait's last attempt, cut off by the bound, may still be waiting for the row on
    // the server; the release can then be chosen as a deadlock's victim, which is
    // retryable.
    let released = within(Duration::from_secs(5), "the holder's release", async {
        loop {
            match backend.release(&key, holder).await {
                Err(err) if err.kind() == ErrorKind::Unavailable => continue,
                done => return done,
            }
        }
    })
    .await
    .unwrap();
    assert!(released.unwrap().is_held());
}

/// MariaDB: another transaction holds the token counter for longer than the request
/// time-out (an acquire of another key that stalls holding it). A try-lock of a free key
/// must still answer promptly, and as contention, not as an unreachable store.
async fn acquire_does_not_wait_out_the_token_counter(db: Database) {
    let backend = db.backend().await;
    let key = key("counter-locked");
    let mut other = RawConnection::open(&db).await;
    other.run("BEGIN").await;
    other
        .run("UPDATE distlock_locks_tokens SET last_token = last_token WHERE id = 1")
        .await;
    let request_timeout = Duration::from_secs(2);
    let client = LockClient::new(backend).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(10),
        request_timeout,
        ..AcquireOptions::default()
    });
    let started = Instant::now();
    let tried = within(
        Duration::from_secs(5),
        "the try-lock",
        client.try_lock(key.as_str()),
    )
    .await
    .unwrap();
    let err = tried.map(|guard| guard.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
    assert!(
        started.elapsed() < request_timeout,
        "the try-lock took {:?}",
        started.elapsed()
    );
    other.run("COMMIT").await;
    client
        .try_lock(key.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A server process stopped with SIGSTOP until dropped.
struct Frozen(String);

impl Frozen {
    fn stop(pid: i64) -> Self {
        let frozen = Frozen(pid.to_string());
        frozen.signal("-STOP");
        frozen
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.0])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {}", self.0);
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.signal("-CONT");
    }
}

/// MariaDB: another transaction holds the row of a live lease; the sweep of expired rows
/// neither waits for it nor blocks an acquire of another key.
async fn sweep_does_not_wait_for_live_rows(db: Database) {
    let backend = db.backend().await;
    let live = key("sweep-live");
    let lease = LeaseId::random();
    backend
        .try_acquire(&request(&live, Duration::from_secs(60), lease))
        .await
        .unwrap()
        .unwrap();
    let expired = key("sweep-expired");
    let gone = LeaseId::random();
    backend
        .try_acquire(&request(&expired, Duration::from_millis(10), gone))
        .await
        .unwrap()
        .unwrap();
    let mut other = RawConnection::open(&db).await;
    other.run("BEGIN").await;
    other
        .run(&format!(
            "SELECT 1 FROM distlock_locks WHERE lock_key = '{}' FOR UPDATE",
            live.as_str()
        ))
        .await;
    eventually(
        Duration::from_secs(2),
        "the short lease expires",
        || async { Ok::<_, Failure>(backend.inspect(&expired).await?.is_none()) },
    )
    .await
    .unwrap();
    let swept = within(Duration::from_secs(2), "the sweep", backend.sweep_expired())
        .await
        .unwrap()
        .unwrap();
    assert!(swept >= 1);
    other.run("COMMIT").await;
    assert!(backend.release(&live, lease).await.unwrap().is_held());
}

/// One test per scenario in a module per database: `postgres::NAME` runs `NAME` on a
/// private PostgreSQL server.
macro_rules! on_database {
    ($($database:ident => [$($scenario:ident),+ $(,)?]),+ $(,)?) => {$(
        mod $database {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(Database::$database().await.unwrap()).await;
                }
            )+
        }
    )+};
}

on_database! {
    postgres => [
        acquire_abandoned_in_a_row_lock_wait_leaves_nothing_held,
        grant_after_a_long_lock_wait_is_not_born_expired,
        takeover_token_is_drawn_under_the_row_lock,
        regrant_and_renewal_never_shorten_the_expiry,
        contended_acquire_does_not_wait_out_a_row_lock,
    ],
    mariadb => [
        acquire_abandoned_in_a_row_lock_wait_leaves_nothing_held,
        grant_after_a_long_lock_wait_is_not_born_expired,
        grant_after_a_long_counter_wait_is_not_handed_out_expired,
        regrant_and_renewal_never_shorten_the_expiry,
        sweep_does_not_wait_for_live_rows,
        contended_acquire_does_not_wait_out_a_row_lock,
        acquire_does_not_wait_out_the_token_counter,
    ],
    sqlite => [regrant_and_renewal_never_shorten_the_expiry],
}

/// PostgreSQL: an acquire of a free key stalls after drawing its token and before
/// inserting its row (its server process frozen while it waits for another transaction's
/// insert of the key, which is then rolled back). A rival acquire meanwhile must not be
/// granted the key and release it, or the stalled acquire would then insert with a token
/// smaller than the rival's, granted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tokens_follow_grants_when_an_insert_stalls() {
    let db = Database::postgres().await.unwrap();
    let backend = db.backend().await;
    let key = key("stalled-insert");
    let ttl = Duration::from_secs(30);
    let mut other = RawConnection::open(&db).await;
    other.run("BEGIN").await;
    insert_expired_row(&mut other, &key, "1").await;
    let (stalled_lease, rival_lease) = (LeaseId::random(), LeaseId::random());
    let stalled = spawn_attempt(&backend, &key, ttl, stalled_lease);
    let frozen = Frozen::stop(blocked_session(&db).await);
    other.run("ROLLBACK").await;
    let mut rival = spawn_attempt(&backend, &key, ttl, rival_lease);
    let rival_first = match tokio::time::timeout(Duration::from_millis(500), &mut rival).await {
        Ok(granted) => {
            let token = granted.unwrap().unwrap();
            // The rival holds the key and lets it go while the other acquire is stalled.
            let _ = backend.release(&key, rival_lease).await.unwrap();
            token
        }
        Err(_) => None,
    };
    drop(frozen);
    let stalled_token = within(Duration::from_secs(5), "the stalled acquire", stalled)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    if let (Some(first), Some(then)) = (rival_first, stalled_token) {
        panic!("the rival was granted {first:?} and released, then the stalled acquire {then:?}");
    }
    assert!(
        stalled_token.is_some(),
        "the stalled acquire was not granted"
    );
    let rival_later = within(Duration::from_secs(5), "the rival", rival)
        .await
        .unwrap()
        .unwrap()
        .unwrap_or(None);
    assert_eq!(rival_later, None, "the rival was granted a held key");
    let _ = backend.release(&key, stalled_lease).await.unwrap();
}

/// Writes the row of an expired lease of `key` (another holder's, long gone) with the
/// token the SQL expression `token` gives.
async fn insert_expired_row(conn: &mut RawConnection, key: &LockKey, token: &str) {
    conn.run(&format!(
        "INSERT INTO distlock_locks (lock_key, lease_id, token, expires_at) \
         VALUES ('{}', '{}', {token}, 0)",
        key.as_str(),
        LeaseId::random()
    ))
    .await;
}

/// A connection whose open transaction holds the row lock of `key` until it ends.
async fn lock_row(db: &Database, key: &LockKey) -> RawConnection {
    let mut conn = RawConnection::open(db).await;
    conn.run("BEGIN").await;
    conn.run(&format!(
        "SELECT 1 FROM distlock_locks WHERE lock_key = '{}' FOR UPDATE",
        key.as_str()
    ))
    .await;
    conn
}
