//! Semaphores and reader-writer locks on every dialect (the holds table): the limit is
//! kept, also by acquirers racing on separate connections; a disagreeing limit is refused;
//! readers share and a writer is alone; a waiting writer keeps new readers out until it
//! is granted or gives up (its intent is removed by its release, and ignored once
//! expired); tokens grow; renewals of shared holds ride the batch; nothing is left stored
//! once every holder is gone.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::{eventually, within, FaultyBackend, Op};
use lock_core::backend::{AcquireRequest, LeaseRenewal, LockBackend, Ownership};
use lock_core::{
    AcquireOptions, Backoff, ErrorKind, HoldKind, LeaseId, LockClient, LockKey, Primitive, Renewal,
};
use lock_sql::SqlBackend;

mod raw_connection;
mod support;
use raw_connection::RawConnection;
use support::Database;

/// A key of its own for each scenario run, so scenarios sharing a database never meet.
fn key(name: &str) -> String {
    format!("shared-{name}/{}", LeaseId::random())
}

/// What the store keeps under `prefix`.
async fn stored(backend: &SqlBackend, prefix: &str) -> Vec<String> {
    backend.stored_keys(prefix).await.unwrap()
}

/// A request of `kind` on `key` for the backend's own calls.
fn request(key: &str, kind: HoldKind, ttl: Duration) -> AcquireRequest {
    let key = LockKey::new(key).unwrap().held_as(kind).unwrap();
    AcquireRequest::new(key, ttl, Duration::ZERO, Renewal::Manual)
}

/// At most `permits` holders; each permit's token above the ones before; the mutex, the
/// semaphore and the reader-writer lock of one name never contend; nothing stored after.
async fn n_permits_at_most(db: &Database) {
    let backend = db.backend().await;
    let client = LockClient::new(backend.clone());
    let key = key("permits");
    let mutex = client.lock(&key).no_wait().await.unwrap();
    let writer = client.write_lock(&key).no_wait().await.unwrap();
    let first = client.semaphore(&key, 2).no_wait().await.unwrap();
    let second = client.semaphore(&key, 2).no_wait().await.unwrap();
    assert!(second.token() > first.token());
    let third = client.semaphore(&key, 2).no_wait().await.unwrap_err();
    assert_eq!(third.kind(), ErrorKind::HeldByAnother, "{third}");
    let holders = client.holders(&key, Primitive::Semaphore).await.unwrap();
    assert_eq!(
        holders
            .iter()
            .map(|holder| (holder.token, holder.kind))
            .collect::<Vec<_>>(),
        vec![
            (first.token(), HoldKind::Permit { limit: 2 }),
            (second.token(), HoldKind::Permit { limit: 2 })
        ],
        "holders, oldest first"
    );
    let oldest = client.inspect(&key).await.unwrap().expect("the mutex");
    assert_eq!(oldest.token, mutex.token());
    first.release().await.unwrap();
    let third = client.semaphore(&key, 2).no_wait().await.unwrap();
    assert!(third.token() > second.token());
    for guard in [mutex, writer, second, third] {
        guard.release().await.unwrap();
    }
    assert!(client
        .holders(&key, Primitive::Semaphore)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(stored(&backend, &key).await, Vec::<String>::new());
}

/// A permit asked with another limit than the holders' is refused, naming both; once the
/// semaphore is empty its limit may change.
async fn limit_disagreement_is_refused(db: &Database) {
    let client = LockClient::new(db.backend().await);
    let key = key("limits");
    let held = client.semaphore(&key, 2).no_wait().await.unwrap();
    for wait in [false, true] {
        let request = client.semaphore(&key, 3);
        let request = if wait {
            request.wait_up_to(Duration::from_secs(5))
        } else {
            request.no_wait()
        };
        let err = request.await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let message = err.to_string();
        assert!(
            message.contains('2') && message.contains('3'),
            "the message names both limits: {message}"
        );
    }
    held.release().await.unwrap();
    let changed = client.semaphore(&key, 3).no_wait().await.unwrap();
    changed.release().await.unwrap();
}

/// Readers share; a writer waits for every reader, and readers for the writer; every
/// grant's token is above the ones before.
async fn readers_share_writer_excluded(db: &Database) {
    let backend = db.backend().await;
    let client = LockClient::new(backend.clone());
    let key = key("rw");
    let first = client.read_lock(&key).no_wait().await.unwrap();
    let second = client.read_lock(&key).no_wait().await.unwrap();
    assert!(second.token() > first.token());
    let refused = client.write_lock(&key).no_wait().await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::HeldByAnother, "{refused}");
    let holders = client.holders(&key, Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|holder| holder.kind == HoldKind::Read));
    first.release().await.unwrap();
    assert!(client.write_lock(&key).no_wait().await.is_err());
    let last_read = second.token();
    second.release().await.unwrap();
    let writer = client.write_lock(&key).no_wait().await.unwrap();
    assert!(writer.token() > last_read);
    let reader = client.read_lock(&key).no_wait().await.unwrap_err();
    assert_eq!(reader.kind(), ErrorKind::HeldByAnother, "{reader}");
    let holders = client.holders(&key, Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, HoldKind::Write);
    writer.release().await.unwrap();
    let reader = client.read_lock(&key).no_wait().await.unwrap();
    reader.release().await.unwrap();
    assert_eq!(stored(&backend, &key).await, Vec::<String>::new());
}

/// Whether a new reader (on a client of its own) would be admitted now; one that is
/// leaves again at once.
async fn reader_gets_in(client: &LockClient, key: &str) -> bool {
    match client.read_lock(key).no_wait().await {
        Ok(guard) => {
            guard.release().await.unwrap();
            true
        }
        Err(err) => {
            assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
            false
        }
    }
}

/// A writer waiting behind a reader keeps new readers out; when it gives up, they get in
/// again and nothing of it is left stored. When it waits on, it gets the lock once the
/// reader leaves, ahead of the readers that came after it.
async fn waiting_writer_blocks_new_readers(db: &Database) {
    let reader = LockClient::new(db.backend().await);
    let writer = LockClient::new(db.backend().await);
    let backend = db.backend().await;
    let newcomer = LockClient::new(backend.clone());
    let key = key("writer-waits");
    let held = reader.read_lock(&key).no_wait().await.unwrap();
    assert!(reader_gets_in(&newcomer, &key).await);

    // A writer that gives up.
    let bound = Duration::from_secs(3);
    let gives_up = tokio::spawn({
        let (writer, key) = (writer.clone(), key.clone());
        async move { writer.write_lock(&key).wait_up_to(bound).await }
    });
    eventually(
        Duration::from_secs(10),
        "the writer's intent shows",
        || async { Ok(!reader_gets_in(&newcomer, &key).await) },
    )
    .await
    .unwrap();
    let err = gives_up.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    eventually(
        Duration::from_secs(10),
        "readers get in once the writer gave up",
        || async { Ok(reader_gets_in(&newcomer, &key).await) },
    )
    .await
    .unwrap();

    // A writer that waits on.
    let waits = tokio::spawn({
        let (writer, key) = (writer.clone(), key.clone());
        async move {
            writer
                .write_lock(&key)
                .wait_up_to(Duration::from_secs(60))
                .await
        }
    });
    eventually(
        Duration::from_secs(10),
        "the writer's intent shows",
        || async { Ok(!reader_gets_in(&newcomer, &key).await) },
    )
    .await
    .unwrap();
    let last_read = held.token();
    held.release().await.unwrap();
    let granted = waits.await.unwrap().unwrap();
    assert!(granted.token() > last_read);
    assert!(!reader_gets_in(&newcomer, &key).await);
    granted.release().await.unwrap();
    assert!(reader_gets_in(&newcomer, &key).await);
    eventually(
        Duration::from_secs(10),
        "nothing is left stored",
        || async { Ok(stored(&backend, &key).await.is_empty()) },
    )
    .await
    .unwrap();
}

/// At the backend: a single try leaves no intent; a waiting writer's intent is removed by
/// its release (which answers not held) and ignored once expired.
async fn intents_end_by_release_or_expiry(db: &Database) {
    let backend = db.backend().await;
    let key = key("intents");
    let long = Duration::from_secs(60);
    let reader = request(&key, HoldKind::Read, long);
    backend.try_acquire(&reader).await.unwrap().expect("free");
    let once = request(&key, HoldKind::Write, long);
    assert!(backend.try_acquire(&once).await.unwrap().is_none());
    let newcomer = request(&key, HoldKind::Read, long);
    let admitted = backend.try_acquire(&newcomer).await.unwrap();
    assert!(admitted.is_some(), "a single try left an intent");
    assert!(backend
        .release(newcomer.key(), newcomer.lease_id())
        .await
        .unwrap()
        .is_held());

    let waiting = request(&key, HoldKind::Write, long).waiting(true);
    assert!(backend.try_acquire(&waiting).await.unwrap().is_none());
    let newcomer = request(&key, HoldKind::Read, long);
    assert!(backend.try_acquire(&newcomer).await.unwrap().is_none());
    assert_eq!(
        backend
            .release(waiting.key(), waiting.lease_id())
            .await
            .unwrap(),
        Ownership::NotHeld,
        "only an intent was there"
    );
    let admitted = backend.try_acquire(&newcomer).await.unwrap();
    assert!(admitted.is_some(), "the released intent kept a reader out");
    assert!(backend
        .release(newcomer.key(), newcomer.lease_id())
        .await
        .unwrap()
        .is_held());

    let short = request(&key, HoldKind::Write, Duration::from_millis(300)).waiting(true);
    assert!(backend.try_acquire(&short).await.unwrap().is_none());
    let newcomer = request(&key, HoldKind::Read, long);
    assert!(backend.try_acquire(&newcomer).await.unwrap().is_none());
    eventually(
        Duration::from_secs(10),
        "a reader gets in once the intent expired",
        || async { Ok(backend.try_acquire(&newcomer).await?.is_some()) },
    )
    .await
    .unwrap();
    for lease in [&reader, &newcomer] {
        assert!(backend
            .release(lease.key(), lease.lease_id())
            .await
            .unwrap()
            .is_held());
    }
    assert_eq!(stored(&backend, &key).await, Vec::<String>::new());
}

/// One batch renews mutexes and shared holds together, each by its own (key, primitive,
/// lease id); a lease the store does not have is answered not held. A permit renewed by
/// the client's engine outlives several of its TTLs.
async fn shared_holds_renew_in_the_batch(db: &Database) {
    let backend = db.backend().await;
    let key = key("renewals");
    let ttl = Duration::from_secs(60);
    let mutex = request(&key, HoldKind::Mutex, ttl);
    let permit = request(&key, HoldKind::Permit { limit: 2 }, ttl);
    let read = request(&key, HoldKind::Read, ttl);
    for lease in [&mutex, &permit, &read] {
        backend.try_acquire(lease).await.unwrap().expect("free");
    }
    // The same lease id under another primitive is not the permit's.
    let stranger = LeaseRenewal {
        key: LockKey::new(&key)
            .unwrap()
            .held_as(HoldKind::Write)
            .unwrap(),
        lease_id: permit.lease_id(),
        ttl,
    };
    let batch: Vec<LeaseRenewal> = [&mutex, &permit, &read]
        .into_iter()
        .map(|lease| LeaseRenewal {
            key: lease.key().clone(),
            lease_id: lease.lease_id(),
            ttl,
        })
        .chain([stranger])
        .collect();
    let renewed: Vec<Ownership> = backend
        .renew_many(&batch)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        renewed,
        vec![
            Ownership::Held,
            Ownership::Held,
            Ownership::Held,
            Ownership::NotHeld
        ]
    );
    for lease in [&mutex, &permit, &read] {
        assert!(backend
            .release(lease.key(), lease.lease_id())
            .await
            .unwrap()
            .is_held());
    }

    let client = LockClient::new(backend.clone());
    let short = Duration::from_secs(1);
    let guard = client
        .semaphore(&key, 1)
        .ttl(short)
        .no_wait()
        .await
        .unwrap();
    // Time passing is what is tested: the permit must outlive three of its TTLs.
    tokio::time::sleep(short * 3).await;
    assert!(guard.is_held());
    let holders = client.holders(&key, Primitive::Semaphore).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].token, guard.token());
    guard.release().await.unwrap();
    assert_eq!(stored(&backend, &key).await, Vec::<String>::new());
}

/// Acquirers on connections of their own race for a semaphore of `LIMIT` permits: never
/// more than `LIMIT` hold it at once, and no token is handed out twice.
async fn concurrent_acquirers_never_exceed_the_limit(db: &Database) {
    const LIMIT: u32 = 3;
    const TASKS: usize = 6;
    const ROUNDS: usize = 12;
    let key = key("race");
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let backend = db.backend().await;
        let (key, holding, most) = (key.clone(), Arc::clone(&holding), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..ROUNDS {
                let permit = request(
                    &key,
                    HoldKind::Permit { limit: LIMIT },
                    Duration::from_secs(60),
                );
                let Some(grant) = backend.try_acquire(&permit).await.unwrap() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                tokens.push(grant.token());
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let holders = backend.holders(permit.key()).await.unwrap();
                assert!(holders.len() <= LIMIT as usize, "{} holders", holders.len());
                holding.fetch_sub(1, Ordering::SeqCst);
                assert!(backend
                    .release(permit.key(), permit.lease_id())
                    .await
                    .unwrap()
                    .is_held());
            }
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT as usize, "{most} held the semaphore at once");
    assert!(!tokens.is_empty(), "nobody was granted");
    let granted = tokens.len();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), granted, "a token was handed out twice");
    let backend = db.backend().await;
    assert_eq!(stored(&backend, &key).await, Vec::<String>::new());
}

/// A database made before the holds table existed (dropped here, with a lock held) gets
/// it when a backend connects, and keeps its locks.
async fn an_older_database_gets_the_holds_table(db: &Database) {
    let table = format!("old_{:08x}", fastrand::u32(..));
    let url = db.url_with(&format!("table={table}"));
    let connect = || async {
        SqlBackend::connect(lock_sql::SqlConfig::from_url(&url).unwrap())
            .await
            .unwrap()
    };
    let key = key("older");
    let held = LockClient::new(connect().await).lock(&key).await.unwrap();
    let drop_table = format!("DROP TABLE {table}_holds");
    if db.name == "sqlite" {
        use sqlx::{Connection, Executor};
        let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(drop_table)).await.unwrap();
    } else {
        RawConnection::open(db).await.run(&drop_table).await;
    }
    let client = LockClient::new(connect().await);
    let status = client
        .inspect(&key)
        .await
        .unwrap()
        .expect("the lock was kept");
    assert_eq!(status.token, held.token());
    let permit = client.semaphore(&key, 1).no_wait().await.unwrap();
    assert!(permit.token() > held.token());
    permit.release().await.unwrap();
    held.release().await.unwrap();
}

/// Another transaction holds what a shared acquire of the key takes turns on (PostgreSQL:
/// the key's advisory lock; MariaDB: the token counter's row) for longer than the acquire
/// waits: the attempt answers "held by another" after about a second, writing nothing,
/// and the key is granted once the other transaction ended.
async fn contended_shared_acquire_does_not_wait_out_a_lock(db: &Database) {
    let backend = db.backend().await;
    let key = key("turn");
    let mut other = RawConnection::open(db).await;
    other.run("BEGIN").await;
    match db.name {
        "postgres" => {
            other
                .run(&format!(
                "SELECT pg_advisory_xact_lock(hashtextextended('distlock_locks_holds/semaphore/' \
                     || '{key}', 0))"
            ))
                .await
        }
        _ => {
            other
                .run("UPDATE distlock_locks_tokens SET last_token = last_token WHERE id = 1")
                .await
        }
    }
    let permit = request(&key, HoldKind::Permit { limit: 2 }, Duration::from_secs(60));
    let started = Instant::now();
    let answer = backend.try_acquire(&permit).await.unwrap();
    let waited = started.elapsed();
    assert!(answer.is_none(), "granted while another held the turn");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "the attempt waited {waited:?} for the turn"
    );
    assert!(backend.holders(permit.key()).await.unwrap().is_empty());
    other.run("COMMIT").await;
    backend
        .try_acquire(&permit)
        .await
        .unwrap()
        .expect("free again");
    assert!(backend
        .release(permit.key(), permit.lease_id())
        .await
        .unwrap()
        .is_held());
}

/// PostgreSQL: a permit's release wakes a waiter of the semaphore through NOTIFY, long
/// before its fallback poll (20 s and more) would.
async fn release_notifies_the_semaphores_waiters(db: &Database) {
    let key = key("notified");
    let holder = LockClient::new(db.backend().await);
    let held = holder.semaphore(&key, 1).no_wait().await.unwrap();
    let counted = FaultyBackend::new(Arc::new(db.backend().await));
    let waiter = LockClient::new(counted.clone());
    let options = AcquireOptions {
        backoff: Backoff {
            initial: Duration::from_secs(20),
            max: Duration::from_secs(40),
        },
        ..AcquireOptions::default()
    };
    let waits = tokio::spawn({
        let key = key.clone();
        async move {
            waiter
                .semaphore(&key, 1)
                .options(options)
                .wait_up_to(Duration::from_secs(60))
                .await
        }
    });
    // The waiter's first attempt is refused before the release, so the release is what
    // wakes it.
    eventually(
        Duration::from_secs(10),
        "the waiter's first attempt",
        || async { Ok(counted.completed(Op::Acquire) >= 1) },
    )
    .await
    .unwrap();
    held.release().await.unwrap();
    let released = Instant::now();
    let granted = within(Duration::from_secs(10), "the woken waiter's grant", waits)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken after {:?}",
        released.elapsed()
    );
    granted.release().await.unwrap();
}

/// A crashed holder's expired permit is stored until the next acquire of the key or the
/// sweep deletes it; it never counts as a holder.
async fn expired_holds_are_swept(db: &Database) {
    let backend = db.backend().await;
    let key = key("swept");
    let crashed = request(
        &key,
        HoldKind::Permit { limit: 1 },
        Duration::from_millis(100),
    );
    backend.try_acquire(&crashed).await.unwrap().expect("free");
    eventually(Duration::from_secs(10), "the permit expires", || async {
        Ok(backend.holders(crashed.key()).await?.is_empty())
    })
    .await
    .unwrap();
    assert_eq!(stored(&backend, &key).await, vec![key.clone()]);
    assert!(backend.sweep_expired().await.unwrap() >= 1);
    assert_eq!(stored(&backend, &key).await, Vec::<String>::new());
    assert_eq!(
        backend
            .release(crashed.key(), crashed.lease_id())
            .await
            .unwrap(),
        Ownership::NotHeld
    );
}

/// A retried grant (the same lease id, its reply lost) answers the same token and keeps
/// one entry; the next grant's token is greater. For a permit, a read and a write.
async fn a_retried_grant_answers_the_same_token(db: &Database) {
    let backend = db.backend().await;
    for kind in [
        HoldKind::Permit { limit: 1 },
        HoldKind::Read,
        HoldKind::Write,
    ] {
        let key = key("retried");
        let first = request(&key, kind, Duration::from_secs(60));
        let token = backend
            .try_acquire(&first)
            .await
            .unwrap()
            .expect("free")
            .token();
        let again = backend.try_acquire(&first).await.unwrap().expect("its own");
        assert_eq!(again.token(), token, "{kind:?}");
        assert_eq!(backend.holders(first.key()).await.unwrap().len(), 1);
        assert!(backend
            .release(first.key(), first.lease_id())
            .await
            .unwrap()
            .is_held());
        let next = request(&key, kind, Duration::from_secs(60));
        let next_token = backend
            .try_acquire(&next)
            .await
            .unwrap()
            .expect("free")
            .token();
        assert!(next_token > token, "{kind:?}");
        assert!(backend
            .release(next.key(), next.lease_id())
            .await
            .unwrap()
            .is_held());
    }
}

/// Every scenario on one database per dialect (a server start costs seconds).
async fn all_scenarios(db: Database) {
    n_permits_at_most(&db).await;
    limit_disagreement_is_refused(&db).await;
    readers_share_writer_excluded(&db).await;
    waiting_writer_blocks_new_readers(&db).await;
    intents_end_by_release_or_expiry(&db).await;
    shared_holds_renew_in_the_batch(&db).await;
    concurrent_acquirers_never_exceed_the_limit(&db).await;
    an_older_database_gets_the_holds_table(&db).await;
    expired_holds_are_swept(&db).await;
    a_retried_grant_answers_the_same_token(&db).await;
    if db.name != "sqlite" {
        contended_shared_acquire_does_not_wait_out_a_lock(&db).await;
    }
    if db.name == "postgres" {
        release_notifies_the_semaphores_waiters(&db).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    all_scenarios(Database::sqlite().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    all_scenarios(Database::postgres().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    all_scenarios(Database::mariadb().await.unwrap()).await;
}
