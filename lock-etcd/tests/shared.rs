//! Semaphores and reader-writer locks on a private etcd, through the client API: each
//! holder a client of its own, so every grant is the store's decision.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::backend::{AcquireRequest, Ownership, Turn};
use lock_core::{ErrorKind, HoldKind, LockClient, LockGuard, LockKey, Primitive, Renewal};
use support::{connect, etcd_url, start_etcd};

const TTL: Duration = Duration::from_secs(10);

/// How long a test waits for something it expects to happen.
const PATIENCE: Duration = Duration::from_secs(20);

async fn clients_of(url: &str, n: usize) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(LockClient::new(connect(url).await));
    }
    clients
}

/// Waits until `check` holds, polling the store, failing after [`PATIENCE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many acquisitions queue for `key`'s `primitive`, as the store says.
async fn waiters(client: &LockClient, key: &str, primitive: Primitive) -> usize {
    let holders = client.holders(key, primitive).await.unwrap();
    holders.first().and_then(|h| h.waiters).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_admits_its_limit_and_no_more() {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let probe = connect(&url).await;
    let clients = clients_of(&url, 4).await;
    let mut held = Vec::new();
    for client in &clients[..3] {
        held.push(
            client
                .semaphore("pool", 3)
                .ttl(TTL)
                .no_wait()
                .await
                .unwrap(),
        );
    }
    let refused = clients[3].semaphore("pool", 3).ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let holders = clients[0]
        .holders("pool", Primitive::Semaphore)
        .await
        .unwrap();
    let tokens: Vec<u64> = held.iter().map(|g| g.token().get()).collect();
    let listed: Vec<u64> = holders.iter().map(|h| h.token.get()).collect();
    assert_eq!(listed, tokens, "every holder, oldest first");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(holders
        .iter()
        .all(|h| h.kind == HoldKind::Permit { limit: 3 } && h.waiters == Some(0)));
    // The mutex and the reader-writer lock of the same name are other keys.
    let mutex = clients[3].lock("pool").ttl(TTL).no_wait().await.unwrap();
    let write = clients[3]
        .write_lock("pool")
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    held.remove(1).release().await.unwrap();
    let fourth = clients[3]
        .semaphore("pool", 3)
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    assert!(fourth.token() > held[1].token());
    for guard in held.into_iter().chain([fourth, mutex, write]) {
        guard.release().await.unwrap();
    }
    assert!(probe.stored_keys("").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_disagreement_names_both_limits() {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let probe = connect(&url).await;
    let clients = clients_of(&url, 2).await;
    let held = clients[0]
        .semaphore("s", 2)
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    for wait in [Duration::ZERO, Duration::from_secs(2)] {
        // A single try, and a waiter (which queues).
        let err = clients[1]
            .semaphore("s", 5)
            .ttl(TTL)
            .wait_up_to(wait)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let text = err.to_string();
        assert!(text.contains(" 2") && text.contains(" 5"), "{text}");
    }
    // A waiter of the semaphore's limit in the queue counts as well.
    let other = clients[0]
        .semaphore("s", 2)
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    let waiting = {
        let client = clients[1].clone();
        tokio::spawn(async move { client.semaphore("s", 2).ttl(TTL).await })
    };
    eventually("the waiter queues", || async {
        waiters(&clients[0], "s", Primitive::Semaphore).await == 1
    })
    .await;
    let err = clients[1]
        .semaphore("s", 3)
        .ttl(TTL)
        .wait_up_to(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(" 3"), "{err}");
    held.release().await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    other.release().await.unwrap();
    second.release().await.unwrap();
    // Empty: the next holder sets the limit.
    let five = clients[1]
        .semaphore("s", 5)
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    five.release().await.unwrap();
    assert!(probe.stored_keys("").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_them() {
    readers_share_and_a_writer_excludes_them_in("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_them_in_the_etcd_mutex_layout() {
    readers_share_and_a_writer_excludes_them_in("layout=etcd-mutex").await;
}

async fn readers_share_and_a_writer_excludes_them_in(options: &str) {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], options);
    let probe = connect(&url).await;
    let clients = clients_of(&url, 3).await;
    let first = clients[0]
        .read_lock("doc")
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    let second = clients[1]
        .read_lock("doc")
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    assert!(second.token() > first.token());
    let refused = clients[2].write_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let holders = clients[2].holders("doc", Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| h.kind == HoldKind::Read));
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = clients[2]
        .write_lock("doc")
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    let refused = clients[0].read_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let refused = clients[1].write_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let holders = clients[0].holders("doc", Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].kind, holders[0].token),
        (HoldKind::Write, writer.token())
    );
    writer.release().await.unwrap();
    assert!(probe.stored_keys("").await.unwrap().is_empty());
}

/// Readers that come after a waiting writer wait behind it (and a single try of theirs
/// is refused), so overlapping readers cannot starve it; a release wakes the next one at
/// once, and tokens follow the grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_later_readers() {
    a_waiting_writer_goes_before_later_readers_in("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_later_readers_in_the_etcd_mutex_layout() {
    a_waiting_writer_goes_before_later_readers_in("layout=etcd-mutex").await;
}

async fn a_waiting_writer_goes_before_later_readers_in(options: &str) {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], options);
    let probe = connect(&url).await;
    let clients = clients_of(&url, 3).await;
    let reader = clients[0]
        .read_lock("doc")
        .ttl(TTL)
        .no_wait()
        .await
        .unwrap();
    let writer = {
        let client = clients[1].clone();
        tokio::spawn(async move { client.write_lock("doc").ttl(TTL).await })
    };
    eventually("the writer queues", || async {
        waiters(&clients[0], "doc", Primitive::RwLock).await == 1
    })
    .await;
    let refused = clients[2].read_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let late_reader = {
        let client = clients[2].clone();
        tokio::spawn(async move { client.read_lock("doc").ttl(TTL).await })
    };
    eventually("the late reader queues", || async {
        waiters(&clients[0], "doc", Primitive::RwLock).await == 2
    })
    .await;
    let released = Instant::now();
    let first_token = reader.token();
    reader.release().await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    // Woken by the release, not by a poll (a poll of a 10 s TTL waits up to 3 s).
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    assert!(writer.token() > first_token);
    assert!(!late_reader.is_finished(), "a reader went with the writer");
    let holders = clients[0].holders("doc", Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].waiters, Some(1));
    let writer_token = writer.token();
    writer.release().await.unwrap();
    let late_reader = late_reader.await.unwrap().unwrap();
    assert!(late_reader.token() > writer_token);
    late_reader.release().await.unwrap();
    assert!(probe.stored_keys("").await.unwrap().is_empty());
}

/// Permits, reads and writes, one after another and waiting in turns: each token above
/// every one before it in the primitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_with_every_grant() {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let clients = clients_of(&url, 2).await;
    let mut last = 0;
    let mut check = |guard: &LockGuard| {
        let token = guard.token().get();
        assert!(token > last, "{token} after {last}");
        last = token;
    };
    for round in 0..3 {
        let client = &clients[round % 2];
        for kind in [
            HoldKind::Permit { limit: 2 },
            HoldKind::Read,
            HoldKind::Write,
        ] {
            let request = match kind {
                HoldKind::Read => client.read_lock("t"),
                HoldKind::Write => client.write_lock("t"),
                _ => client.semaphore("t", 2),
            };
            let guard = request.ttl(TTL).await.unwrap();
            check(&guard);
            guard.release().await.unwrap();
        }
    }
    // Two readers queued behind one writer are granted together; whichever reports first,
    // each token is above the writer's and the two differ.
    let writer = clients[0].write_lock("t").ttl(TTL).await.unwrap();
    check(&writer);
    let more = clients_of(&url, 2).await;
    let readers: Vec<_> = more
        .into_iter()
        .map(|client| tokio::spawn(async move { client.read_lock("t").ttl(TTL).await }))
        .collect();
    eventually("both readers queue", || async {
        waiters(&clients[1], "t", Primitive::RwLock).await == 2
    })
    .await;
    let writer_token = writer.token();
    writer.release().await.unwrap();
    let mut tokens = Vec::new();
    for reader in readers {
        let reader = reader.await.unwrap().unwrap();
        tokens.push(reader.token());
        reader.release().await.unwrap();
    }
    assert!(tokens.iter().all(|t| *t > writer_token) && tokens[0] != tokens[1]);
}

/// Nothing is left in etcd once holders released and a waiter gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_stored_after_release_or_a_waiter_giving_up() {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let probe = connect(&url).await;
    let clients = clients_of(&url, 2).await;
    let permit = clients[0].semaphore("gone", 1).ttl(TTL).await.unwrap();
    let writer = clients[0].write_lock("gone").ttl(TTL).await.unwrap();
    assert_eq!(probe.stored_keys("").await.unwrap(), vec!["gone"]);
    let short = Duration::from_millis(300);
    for waited in [
        clients[1]
            .semaphore("gone", 1)
            .ttl(TTL)
            .wait_up_to(short)
            .await,
        clients[1]
            .read_lock("gone")
            .ttl(TTL)
            .wait_up_to(short)
            .await,
        clients[1]
            .write_lock("gone")
            .ttl(TTL)
            .wait_up_to(short)
            .await,
    ] {
        assert_eq!(waited.unwrap_err().kind(), ErrorKind::TimedOut);
    }
    let holders = clients[1].holders("gone", Primitive::RwLock).await.unwrap();
    assert_eq!(holders[0].waiters, Some(0), "the waiters left the queue");
    permit.release().await.unwrap();
    writer.release().await.unwrap();
    assert!(probe.stored_keys("").await.unwrap().is_empty());
    assert!(clients[0]
        .holders("gone", Primitive::Semaphore)
        .await
        .unwrap()
        .is_empty());
}

/// Many clients taking permits at once, waiting in the queue and trying without it: the
/// store never has more holders than the limit, and every one gets its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_never_exceed_the_limit() {
    const LIMIT: usize = 3;
    const ROUNDS: usize = 4;
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let probe = connect(&url).await;
    let clients = clients_of(&url, 8).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, client)| {
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                let mut granted = 0;
                while granted < ROUNDS {
                    let request = client.semaphore("busy", LIMIT as u32).ttl(TTL);
                    // Half of them try without queueing, and try again when refused.
                    let guard = if i % 2 == 0 {
                        request.wait_up_to(PATIENCE).await.unwrap()
                    } else {
                        match request.no_wait().await {
                            Ok(guard) => guard,
                            Err(err) if err.kind() == ErrorKind::HeldByAnother => {
                                tokio::task::yield_now().await;
                                continue;
                            }
                            Err(err) => panic!("{err}"),
                        }
                    };
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let stored = client.holders("busy", Primitive::Semaphore).await.unwrap();
                    assert!(stored.len() <= LIMIT, "{} holders", stored.len());
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                    granted += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=LIMIT).contains(&most), "{most} at once");
    assert!(probe.stored_keys("").await.unwrap().is_empty());
}

/// At the store: a retried try or queued attempt answers its grant again with the same
/// token, a retried enqueue keeps one entry, a queued entry is not held (renewing it
/// answers `NotHeld`), and the waiter's grant comes after the holder's release with a
/// greater token. Each pair a holder's kind and a waiter's it keeps waiting, in both
/// layouts (semaphores only in the distlock layout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_grants_and_enqueues_answer_the_same() {
    let server = start_etcd().await;
    let pairs = [
        (HoldKind::Permit { limit: 1 }, HoldKind::Permit { limit: 1 }),
        (HoldKind::Write, HoldKind::Read),
        (HoldKind::Read, HoldKind::Write),
    ];
    for options in ["", "layout=etcd-mutex"] {
        let backend = connect(&etcd_url(&[server.addr()], options)).await;
        for (at, (holds, waits)) in pairs.into_iter().enumerate() {
            if options.contains("etcd-mutex") && holds.primitive() == Primitive::Semaphore {
                continue;
            }
            let name = LockKey::new(format!("retry-{at}")).unwrap();
            let request = |kind| {
                AcquireRequest::new(
                    name.held_as(kind).unwrap(),
                    TTL,
                    Duration::ZERO,
                    Renewal::Auto,
                )
            };
            let holder = request(holds);
            let first = backend.try_acquire(&holder).await.unwrap().unwrap();
            let again = backend.try_acquire(&holder).await.unwrap().unwrap();
            assert_eq!(first.token(), again.token(), "{options} {holds:?}");
            let waiter = request(waits);
            assert!(backend.try_acquire(&waiter).await.unwrap().is_none());
            backend.enqueue(&waiter).await.unwrap();
            backend.enqueue(&waiter).await.unwrap();
            let holders = backend.holders(waiter.key()).await.unwrap();
            assert_eq!(holders.len(), 1);
            assert_eq!(holders[0].waiters, Some(1), "{options} {waits:?}");
            assert!(matches!(
                backend.try_acquire_queued(&waiter).await.unwrap(),
                Turn::Waiting
            ));
            let renewed = backend.renew(waiter.key(), waiter.lease_id(), TTL).await;
            assert_eq!(renewed.unwrap(), Ownership::NotHeld, "{options} {waits:?}");
            let released = backend.release(holder.key(), holder.lease_id()).await;
            assert_eq!(released.unwrap(), Ownership::Held);
            let Turn::Granted(granted) = backend.try_acquire_queued(&waiter).await.unwrap() else {
                panic!("{options} {waits:?}: not granted after the release");
            };
            assert!(granted.token() > first.token());
            let Turn::Granted(again) = backend.try_acquire_queued(&waiter).await.unwrap() else {
                panic!("{options} {waits:?}: a retry was not granted");
            };
            assert_eq!(granted.token(), again.token());
            let again = backend.try_acquire(&waiter).await.unwrap().unwrap();
            assert_eq!(granted.token(), again.token());
            let renewed = backend.renew(waiter.key(), waiter.lease_id(), TTL).await;
            assert_eq!(renewed.unwrap(), Ownership::Held);
            let released = backend.release(waiter.key(), waiter.lease_id()).await;
            assert_eq!(released.unwrap(), Ownership::Held);
        }
        assert!(
            backend.stored_keys("").await.unwrap().is_empty(),
            "{options}"
        );
    }
}
