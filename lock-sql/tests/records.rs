//! Idempotency records where the SQL store differs from the contract's model: a record
//! write waits for a takeover of the holder's row that is in flight and is then refused;
//! an expired lease whose row is still in the table cannot write; records past their
//! retention are never read and are swept, live ones are kept.
//!
//! The conformance suite covers the records' behaviour on every dialect
//! (`conformance_*`); these tests look at the table.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use conformance_tests::{eventually, within, Failure};
use lock_core::backend::{AcquireRequest, LockBackend, Ownership, Record};
use lock_core::{FencingToken, LeaseId, LockKey, Renewal};

mod raw_connection;
mod support;
use raw_connection::RawConnection;
use support::Database;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(50);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}/{}", LeaseId::random())).unwrap()
}

fn record(value: &[u8], token: FencingToken) -> Record {
    Record {
        value: value.to_vec(),
        fingerprint: Some(b"request".to_vec()),
        token,
    }
}

/// Grants `key` to a new lease for `ttl`; answers the lease and its token.
async fn hold(backend: &impl LockBackend, key: &LockKey, ttl: Duration) -> (LeaseId, FencingToken) {
    let lease = LeaseId::random();
    let request =
        AcquireRequest::new(key.clone(), ttl, Duration::ZERO, Renewal::Manual).with_lease_id(lease);
    let grant = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .expect("a free key");
    (lease, grant.token())
}

/// Another transaction takes the holder's row over (uncommitted) while the holder writes
/// its record: the write waits for it (it reads the row with a lock, not from a snapshot
/// taken before the takeover committed) and is then refused, so the next holder's check
/// for a record can never miss one that is still being written.
async fn a_write_racing_a_takeover_waits_and_is_refused(db: Database) {
    let backend = db.backend().await;
    let key = key("racing-takeover");
    let (lease, token) = hold(&backend, &key, LONG).await;
    let mut rival = RawConnection::open(&db).await;
    rival.run("BEGIN").await;
    rival
        .run(&format!(
            "UPDATE distlock_locks SET lease_id = '{}', token = token + 1 WHERE lock_key = '{}'",
            LeaseId::random(),
            key.as_str()
        ))
        .await;
    let write = {
        let (backend, key) = (backend.clone(), key.clone());
        tokio::spawn(async move {
            backend
                .write_record(&key, lease, &record(b"late", token), LONG)
                .await
        })
    };
    RawConnection::wait_for_lock_waits(&db, 1).await;
    rival.run("COMMIT").await;
    let written = within(Duration::from_secs(5), "the record write", write)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        written,
        Ownership::NotHeld,
        "a write that waited for a takeover was accepted"
    );
    assert_eq!(backend.read_record(&key).await.unwrap(), None);
}

/// The row of an expired lease stays in the table until it is taken over or swept; its
/// lease may no longer write a record (the expiry is judged by the database's clock).
async fn an_expired_lease_whose_row_remains_cannot_write(db: Database) {
    let backend = db.backend().await;
    let key = key("expired-row");
    let (lease, token) = hold(&backend, &key, SHORT).await;
    eventually(Duration::from_secs(5), "the lease to expire", || async {
        Ok::<_, Failure>(backend.inspect(&key).await.unwrap().is_none())
    })
    .await
    .unwrap();
    assert_eq!(
        backend.stored_keys(key.as_str()).await.unwrap(),
        vec![key.as_str().to_owned()],
        "the expired row is still there"
    );
    let written = backend
        .write_record(&key, lease, &record(b"late", token), LONG)
        .await
        .unwrap();
    assert_eq!(
        written,
        Ownership::NotHeld,
        "an expired lease wrote a record"
    );
    assert_eq!(backend.read_record(&key).await.unwrap(), None);
}

/// A record past its retention reads as none at once, is deleted by the sweep (and only
/// it: a live record stays), and a new holder may record over it, twice alike (the write
/// is idempotent, whatever count of changed rows the dialect reports for it).
async fn expired_records_are_swept_and_live_ones_kept(db: Database) {
    let backend = db.backend().await;
    let (brief, kept) = (key("brief-record"), key("kept-record"));
    for (key, retention) in [(&brief, SHORT), (&kept, LONG)] {
        let (lease, token) = hold(&backend, key, LONG).await;
        assert!(backend
            .write_record(key, lease, &record(b"done", token), retention)
            .await
            .unwrap()
            .is_held());
        assert!(backend.release(key, lease).await.unwrap().is_held());
    }
    eventually(
        Duration::from_secs(5),
        "the brief record to expire",
        || async { Ok::<_, Failure>(backend.read_record(&brief).await.unwrap().is_none()) },
    )
    .await
    .unwrap();
    // A fresh database: the expired record is the only expired row.
    assert_eq!(backend.sweep_expired().await.unwrap(), 1);
    assert_eq!(backend.sweep_expired().await.unwrap(), 0);
    assert!(backend.read_record(&kept).await.unwrap().is_some());
    let (lease, token) = hold(&backend, &brief, LONG).await;
    for attempt in ["first", "retried"] {
        assert!(
            backend
                .write_record(&brief, lease, &record(b"again", token), LONG)
                .await
                .unwrap()
                .is_held(),
            "the {attempt} write of the same record was refused"
        );
    }
    assert_eq!(
        backend.read_record(&brief).await.unwrap(),
        Some(record(b"again", token))
    );
}

/// One test per scenario in a module per database.
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
        a_write_racing_a_takeover_waits_and_is_refused,
        an_expired_lease_whose_row_remains_cannot_write,
        expired_records_are_swept_and_live_ones_kept,
    ],
    mariadb => [
        a_write_racing_a_takeover_waits_and_is_refused,
        an_expired_lease_whose_row_remains_cannot_write,
        expired_records_are_swept_and_live_ones_kept,
    ],
    sqlite => [
        an_expired_lease_whose_row_remains_cannot_write,
        expired_records_are_swept_and_live_ones_kept,
    ],
}
