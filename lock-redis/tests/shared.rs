//! Semaphores and reader-writer locks on one private server: how many hold at once, the
//! limit, writers and readers, the waiting writer's intent, tokens, renewal in the mutex's
//! batch, what is left behind; and Redlock's refusal.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{eventually, within, Failure};
use lock_core::backend::{
    default_drift_allowance, AcquireRequest, DynBackend, LeaseRenewal, LockBackend, Ownership,
};
use lock_core::{AcquireOptions, ErrorKind, HoldKind, LockClient, LockKey, Primitive, Renewal};
use support::{raw, redis_url, redlock_url, start_redis, start_redis_nodes};

/// Bound on anything that should happen at once, on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(10);

fn key(name: &str) -> String {
    format!("shared-{:08x}/{name}", fastrand::u32(..))
}

fn client(backend: &DynBackend) -> LockClient {
    LockClient::new(backend.clone()).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(30),
        renewal: Renewal::Manual,
        ..AcquireOptions::default()
    })
}

fn held_as(name: &str, kind: HoldKind) -> LockKey {
    LockKey::new(name).unwrap().held_as(kind).unwrap()
}

fn request(key: &LockKey, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        key.clone(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    )
}

/// Releases `request`'s hold, which must have been live.
async fn released(backend: &DynBackend, request: &AcquireRequest) {
    assert_eq!(
        backend
            .release(request.key(), request.lease_id())
            .await
            .unwrap(),
        Ownership::Held
    );
}

async fn single(addr: SocketAddr) -> DynBackend {
    support::connect(&redis_url(addr, "")).await
}

/// Every key the server has (fencing counters included), as `KEYS` sees them.
async fn server_keys(addr: SocketAddr) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw(addr).await)
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_admits_its_limit_and_no_more() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let client = client(&backend);
    let name = key("three");
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(client.semaphore(&name, 3).no_wait().await.unwrap());
    }
    let tokens: Vec<u64> = permits.iter().map(|p| p.token().get()).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // Another client, so that the store refuses (a client's own tasks wait in a local
    // line of as many turns as permits first).
    let other = self::client(&backend);
    let refused = other.semaphore(&name, 3).no_wait().await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::HeldByAnother, "{refused}");

    let holders = client.holders(&name, Primitive::Semaphore).await.unwrap();
    let listed: Vec<u64> = holders.iter().map(|h| h.token.get()).collect();
    assert_eq!(listed, tokens, "every holder, oldest first");
    assert!(holders
        .iter()
        .all(|h| h.kind == HoldKind::Permit { limit: 3 }));
    assert_eq!(
        backend
            .inspect(&held_as(&name, HoldKind::Permit { limit: 3 }))
            .await
            .unwrap()
            .map(|h| h.token.get()),
        Some(tokens[0]),
        "inspect tells the oldest"
    );
    // The mutex and the reader-writer lock of that name are other keys.
    assert!(client
        .holders(&name, Primitive::Mutex)
        .await
        .unwrap()
        .is_empty());
    let mutex = client.lock(&name).no_wait().await.unwrap();
    let writer = client.write_lock(&name).no_wait().await.unwrap();

    permits.remove(1).release().await.unwrap();
    let fourth = other.semaphore(&name, 3).no_wait().await.unwrap();
    assert!(fourth.token().get() > tokens[2]);
    for permit in permits {
        permit.release().await.unwrap();
    }
    fourth.release().await.unwrap();
    mutex.release().await.unwrap();
    writer.release().await.unwrap();
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
    // Only the fencing counters stay (the mutex's, the semaphore's, the rwlock's).
    let left = server_keys(server.addr()).await;
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(left.iter().all(|k| k.ends_with(":fence")), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_limit_is_refused_while_anyone_holds() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let client = client(&backend);
    let name = key("limits");
    let permit = client.semaphore(&name, 2).no_wait().await.unwrap();
    for asked in [1, 3] {
        let err = client.semaphore(&name, asked).no_wait().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let message = err.to_string();
        assert!(
            message.contains("limit of 2") && message.contains(&format!("limit of {asked}")),
            "both limits named: {message}"
        );
    }
    // Waiting does not help: the answer is the same.
    let err = client
        .semaphore(&name, 5)
        .wait_up_to(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    permit.release().await.unwrap();
    let changed = client.semaphore(&name, 5).no_wait().await.unwrap();
    changed.release().await.unwrap();
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_holds_alone() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let client = client(&backend);
    let name = key("rw");
    let first = client.read_lock(&name).no_wait().await.unwrap();
    let second = client.read_lock(&name).no_wait().await.unwrap();
    assert!(second.token() > first.token());
    let refused = client.write_lock(&name).no_wait().await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::HeldByAnother, "{refused}");
    let kinds: Vec<HoldKind> = client
        .holders(&name, Primitive::RwLock)
        .await
        .unwrap()
        .iter()
        .map(|h| h.kind)
        .collect();
    assert_eq!(kinds, [HoldKind::Read, HoldKind::Read]);
    first.release().await.unwrap();
    assert!(client.write_lock(&name).no_wait().await.is_err());
    let last_read = second.token();
    second.release().await.unwrap();

    let writer = client.write_lock(&name).no_wait().await.unwrap();
    assert!(writer.token() > last_read);
    for refused in [
        client.read_lock(&name).no_wait().await.unwrap_err(),
        // Another client's: this one's writers wait in a local line first.
        self::client(&backend)
            .write_lock(&name)
            .no_wait()
            .await
            .unwrap_err(),
    ] {
        assert_eq!(refused.kind(), ErrorKind::HeldByAnother, "{refused}");
    }
    let holders = client.holders(&name, Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, HoldKind::Write);
    let written = writer.token();
    writer.release().await.unwrap();
    let after = client.read_lock(&name).no_wait().await.unwrap();
    assert!(after.token() > written);
    after.release().await.unwrap();
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// A writer that waits holds new readers back; it gets the key once the readers before
/// it are gone, and the readers behind it get in after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_later_readers() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let (readers, writers) = (client(&backend), client(&backend));
    let name = key("preference");
    let reader = readers.read_lock(&name).no_wait().await.unwrap();
    let waiting_writer = {
        let (writers, name) = (writers.clone(), name.clone());
        tokio::spawn(async move { writers.write_lock(&name).wait_up_to(SOON).await })
    };
    intent_appears(&readers, &name).await;
    let later = readers.read_lock(&name).no_wait().await.unwrap_err();
    assert_eq!(later.kind(), ErrorKind::HeldByAnother, "{later}");
    let later_reader = {
        let (readers, name) = (readers.clone(), name.clone());
        tokio::spawn(async move { readers.read_lock(&name).wait_up_to(SOON * 2).await })
    };
    let read = reader.token();
    reader.release().await.unwrap();
    let writer = within(SOON, "the writer's grant", waiting_writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(writer.token() > read);
    assert!(!later_reader.is_finished());
    let written = writer.token();
    writer.release().await.unwrap();
    let later = within(SOON, "the later reader's grant", later_reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(later.token() > written);
    later.release().await.unwrap();
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// Waits until a writer's intent holds readers back (seen from outside: a reader's
/// single try is refused while only readers hold the key).
async fn intent_appears(readers: &LockClient, name: &str) {
    eventually(SOON, "the writer's intent", || async {
        Ok::<_, Failure>(
            readers
                .holders(name, Primitive::RwLock)
                .await
                .unwrap()
                .iter()
                .all(|h| h.kind == HoldKind::Read)
                && match readers.read_lock(name).no_wait().await {
                    Ok(extra) => {
                        extra.release().await.unwrap();
                        false
                    }
                    Err(err) => {
                        assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
                        true
                    }
                },
        )
    })
    .await
    .unwrap();
}

/// A writer that gives up takes its intent along: the readers it held back get in, and
/// one that waited is woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_get_in_again_after_the_writer_gives_up() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let (readers, writers) = (client(&backend), client(&backend));
    let name = key("gives-up");
    let reader = readers.read_lock(&name).no_wait().await.unwrap();
    let patience = Duration::from_secs(2);
    let waiting_writer = {
        let (writers, name) = (writers.clone(), name.clone());
        tokio::spawn(async move { writers.write_lock(&name).wait_up_to(patience).await })
    };
    intent_appears(&readers, &name).await;
    let held_back = {
        let (readers, name) = (readers.clone(), name.clone());
        tokio::spawn(async move { readers.read_lock(&name).wait_up_to(SOON * 2).await })
    };
    let gave_up = within(SOON, "the writer giving up", waiting_writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(gave_up.kind().is_retryable(), "{gave_up}");
    let second = within(SOON, "the held-back reader's grant", held_back)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(second.token() > reader.token());
    reader.release().await.unwrap();
    second.release().await.unwrap();
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// The intent as the backend keeps it: left only by a write that waits, it lives for the
/// attempt's TTL, and the writer's grant or release removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_intent_lives_for_its_ttl_unless_granted_or_released() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let name = key("intent");
    let read = held_as(&name, HoldKind::Read);
    let write = held_as(&name, HoldKind::Write);
    let reader = request(&read, Duration::from_secs(30));
    assert!(backend.try_acquire(&reader).await.unwrap().is_some());

    // A single try leaves nothing.
    let once = request(&write, Duration::from_secs(30));
    assert!(backend.try_acquire(&once).await.unwrap().is_none());
    let another = request(&read, Duration::from_secs(30));
    assert!(backend.try_acquire(&another).await.unwrap().is_some());
    released(&backend, &another).await;

    // A waiting writer's intent, released: NotHeld (it held nothing), readers admitted.
    let waits = request(&write, Duration::from_secs(30)).waiting(true);
    assert!(backend.try_acquire(&waits).await.unwrap().is_none());
    let blocked = request(&read, Duration::from_secs(30));
    assert!(backend.try_acquire(&blocked).await.unwrap().is_none());
    assert_eq!(
        backend
            .release(waits.key(), waits.lease_id())
            .await
            .unwrap(),
        Ownership::NotHeld
    );
    assert!(backend.try_acquire(&blocked).await.unwrap().is_some());
    released(&backend, &blocked).await;

    // An intent that nobody removes expires with its TTL.
    let short = request(&write, Duration::from_millis(300)).waiting(true);
    assert!(backend.try_acquire(&short).await.unwrap().is_none());
    let late = request(&read, Duration::from_secs(30));
    assert!(backend.try_acquire(&late).await.unwrap().is_none());
    eventually(SOON, "the intent's expiry", || async {
        Ok::<_, Failure>(backend.try_acquire(&late).await.unwrap().is_some())
    })
    .await
    .unwrap();
    released(&backend, &late).await;

    // The writer's grant removes its intent.
    let writer = request(&write, Duration::from_secs(30)).waiting(true);
    assert!(backend.try_acquire(&writer).await.unwrap().is_none());
    released(&backend, &reader).await;
    let token = backend.try_acquire(&writer).await.unwrap().unwrap().token();
    // A retry whose reply was lost: the same token.
    assert_eq!(
        backend.try_acquire(&writer).await.unwrap().unwrap().token(),
        token
    );
    released(&backend, &writer).await;
    assert!(backend.try_acquire(&late).await.unwrap().is_some());
    released(&backend, &late).await;
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// Renewals of mutexes, permits and reads go in one batch; each acts on its own entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holds_renew_in_the_mutex_batch() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let name = key("batch");
    let short = Duration::from_millis(1500);
    let keys = [
        LockKey::new(&name).unwrap(),
        held_as(&name, HoldKind::Permit { limit: 2 }),
        held_as(&name, HoldKind::Permit { limit: 2 }),
        held_as(&name, HoldKind::Read),
    ];
    let requests: Vec<AcquireRequest> = keys.iter().map(|k| request(k, short)).collect();
    for request in &requests {
        assert!(backend.try_acquire(request).await.unwrap().is_some());
    }
    let mut leases: Vec<LeaseRenewal> = requests
        .iter()
        .map(|r| LeaseRenewal {
            key: r.key().clone(),
            lease_id: r.lease_id(),
            ttl: Duration::from_secs(60),
        })
        .collect();
    // A lease that holds nothing: the other permit's key under a stranger's id.
    let stranger = request(&keys[1], short);
    leases.push(LeaseRenewal {
        key: keys[1].clone(),
        lease_id: stranger.lease_id(),
        ttl: Duration::from_secs(60),
    });
    let renewed: Vec<Ownership> = backend
        .renew_many(&leases)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        renewed,
        [
            Ownership::Held,
            Ownership::Held,
            Ownership::Held,
            Ownership::Held,
            Ownership::NotHeld
        ]
    );
    for key in &keys[1..] {
        for holder in backend.holders(key).await.unwrap() {
            assert!(
                holder.remaining_ttl > Duration::from_secs(50),
                "{key:?}: {:?}",
                holder.remaining_ttl
            );
        }
    }
    // expire_in shortens one permit, and leaves the other alone.
    assert_eq!(
        backend
            .expire_in(&keys[1], requests[1].lease_id(), Duration::from_millis(100))
            .await
            .unwrap(),
        Ownership::Held
    );
    eventually(SOON, "the shortened permit's expiry", || async {
        Ok::<_, Failure>(backend.holders(&keys[1]).await.unwrap().len() == 1)
    })
    .await
    .unwrap();
    assert_eq!(
        backend
            .renew(&keys[1], requests[1].lease_id(), Duration::from_secs(60))
            .await
            .unwrap(),
        Ownership::NotHeld,
        "an expired permit is not renewed"
    );
    for (i, request) in requests.iter().enumerate() {
        if i != 1 {
            released(&backend, request).await;
        }
    }
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// Holders that are never released (their client crashed) leave nothing but the fencing
/// counters once their TTLs have passed, without anyone touching the keys again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_holds_leave_only_counters() {
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let name = key("abandoned");
    let ttl = Duration::from_millis(300);
    let permit = held_as(&name, HoldKind::Permit { limit: 3 });
    let read = held_as(&name, HoldKind::Read);
    for key in [&permit, &permit, &read, &read] {
        assert!(backend
            .try_acquire(&request(key, ttl))
            .await
            .unwrap()
            .is_some());
    }
    let writer = request(&held_as(&name, HoldKind::Write), ttl).waiting(true);
    assert!(backend.try_acquire(&writer).await.unwrap().is_none());
    assert_eq!(
        backend.stored_keys(&name).await.unwrap(),
        vec![name.clone()]
    );
    let before = server_keys(server.addr()).await;
    assert!(before.iter().any(|k| k.ends_with(":intents")), "{before:?}");
    eventually(SOON, "the server dropping every expired key", || async {
        let left = server_keys(server.addr()).await;
        Ok::<_, Failure>(left.len() == 2 && left.iter().all(|k| k.ends_with(":fence")))
    })
    .await
    .unwrap();
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// Many clients racing for a semaphore's permits: never more holders than the limit, by
/// their own count and by the store's, and every grant a token of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_never_exceed_the_limit() {
    const LIMIT: u32 = 3;
    const WORKERS: usize = 8;
    const ROUNDS: usize = 6;
    let server = start_redis().await;
    let backend = single(server.addr()).await;
    let name = key("race");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        // A client each, so that the store alone decides (a client's own tasks queue
        // locally first).
        let client = client(&backend);
        let (name, inside, most) = (name.clone(), Arc::clone(&inside), Arc::clone(&most));
        workers.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..ROUNDS {
                let permit = client
                    .semaphore(&name, LIMIT)
                    .wait_up_to(Duration::from_secs(60))
                    .await
                    .unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let listed = client.holders(&name, Primitive::Semaphore).await.unwrap();
                assert!(listed.len() <= LIMIT as usize, "{} holders", listed.len());
                assert!(listed.iter().any(|h| h.token == permit.token()));
                tokens.push(permit.token().get());
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for worker in workers {
        tokens.extend(
            within(Duration::from_secs(120), "a worker", worker)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT as usize, "{most} held at once");
    assert!(most >= 2, "the permits were never shared ({most} at most)");
    let granted = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), granted, "a token was granted twice");
    assert_eq!(granted, WORKERS * ROUNDS);
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());
}

/// Redlock refuses both shared primitives, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_semaphores_and_reader_writer_locks() {
    let servers = start_redis_nodes(3).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let backend = support::connect(&redlock_url(&addrs, "")).await;
    let capabilities = backend.capabilities();
    assert!(!capabilities.shared_holds);
    let why = capabilities.shared_holds_refusal.unwrap();
    assert!(
        why.contains("a majority of independent nodes cannot keep a count of holders"),
        "{why}"
    );
    let client = client(&backend);
    let name = key("redlock");
    let refusals = [
        client.semaphore(&name, 2).no_wait().await.unwrap_err(),
        client.semaphore(&name, 2).await.unwrap_err(),
        client.read_lock(&name).await.unwrap_err(),
        client.write_lock(&name).no_wait().await.unwrap_err(),
        client
            .holders(&name, Primitive::Semaphore)
            .await
            .unwrap_err(),
    ];
    for err in refusals {
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
    // The mutex is unaffected.
    client
        .lock(&name)
        .no_wait()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
