//! Semaphores and reader-writer locks on ZooKeeper (distlock layout): where their nodes
//! live, the rank rules, tokens, clean-up, and that a release wakes the waiter whose turn
//! it brings through its watches (the fallback poll of these waiters is 20 s away).
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::backend::{default_drift_allowance, AcquireRequest, LockBackendExt};
use lock_core::{
    AcquireOptions, Backoff, ErrorKind, HoldKind, LockClient, LockGuard, LockKey, Primitive,
    Renewal, Result, Wait,
};
use tokio::task::JoinHandle;

use support::{connect, start_zookeeper, zk_url};

/// How long a watched waiter may take to see its turn on a loaded machine: far below its
/// fallback poll ([`watched`]), so a grant within it came from a watch.
const PROMPT: Duration = Duration::from_secs(5);

/// Options of a waiter that polls only every 20 s (a third of its TTL caps the poll), so
/// only a watch wakes it sooner.
fn watched() -> AcquireOptions {
    AcquireOptions {
        ttl: Duration::from_secs(60),
        wait: Wait::UpTo(Duration::from_secs(60)),
        backoff: Backoff {
            initial: Duration::from_secs(30),
            max: Duration::from_secs(30),
        },
        ..AcquireOptions::default()
    }
}

fn key(name: &str) -> String {
    format!("shared-{:016x}-{name}", fastrand::u64(..))
}

async fn client(addr: SocketAddr) -> LockClient {
    LockClient::new(connect(&zk_url(&[addr], "")).await)
}

/// The children of `path` at the server, straight from a plain client.
async fn children(addr: SocketAddr, path: &str) -> Vec<String> {
    let raw = zookeeper_client::Client::connect(&addr.to_string())
        .await
        .unwrap();
    match raw.list_children(path).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(err) => panic!("listing {path}: {err}"),
    }
}

/// Waits (up to `within`) until `check` holds.
async fn until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes `kind` of `key` through `client` in the background, with [`watched`] options.
fn spawn_take(client: &LockClient, key: &str, kind: HoldKind) -> JoinHandle<Result<LockGuard>> {
    let (client, key) = (client.clone(), key.to_string());
    tokio::spawn(async move {
        let request = match kind {
            HoldKind::Permit { limit } => client.semaphore(&key, limit),
            HoldKind::Read => client.read_lock(&key),
            HoldKind::Write => client.write_lock(&key),
            HoldKind::Mutex => client.lock(&key),
        };
        request.options(watched()).await
    })
}

async fn granted(waiting: JoinHandle<Result<LockGuard>>, what: &str) -> LockGuard {
    tokio::time::timeout(PROMPT, waiting)
        .await
        .unwrap_or_else(|_| panic!("{what} was not woken within {PROMPT:?}"))
        .unwrap()
        .unwrap()
}

/// Waits until `key`'s `primitive` has `waiters` queued behind its holders.
async fn queued(client: &LockClient, key: &str, primitive: Primitive, waiters: usize) {
    until(PROMPT, "the waiter queues", || async {
        let holders = client.holders(key, primitive).await.unwrap();
        holders.first().and_then(|h| h.waiters) == Some(waiters)
    })
    .await;
}

/// Three permits of a semaphore hold at once, each a node of its own named with the limit
/// in `<key>.semaphore`; the fourth is refused or waits, and the release of the *oldest*
/// holder (not the node just ahead of the waiter) wakes it at once, with a greater token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_admit_the_limit_and_any_release_wakes_the_first_waiter() {
    let server = start_zookeeper().await;
    let key = key("permits");
    let one = client(server.addr()).await;
    let other = client(server.addr()).await;
    let permits = [
        one.semaphore(&key, 3).await.unwrap(),
        one.semaphore(&key, 3).await.unwrap(),
        other.semaphore(&key, 3).await.unwrap(),
    ];
    let tokens: Vec<_> = permits.iter().map(LockGuard::token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let nodes = children(server.addr(), &format!("/distlock/{key}.semaphore")).await;
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert!(nodes
        .iter()
        .all(|n| n.starts_with("_c_") && n.contains("-permit-3-")));
    // The mutex and the reader-writer lock of the same name are other keys.
    assert!(one.inspect(&key).await.unwrap().is_none());
    let mutex = other.try_lock(&key).await.unwrap();
    mutex.release().await.unwrap();
    let late = client(server.addr()).await;
    let err = late.semaphore(&key, 3).no_wait().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
    let waiting = spawn_take(&late, &key, HoldKind::Permit { limit: 3 });
    queued(&one, &key, Primitive::Semaphore, 1).await;
    let [oldest, second, third] = permits;
    oldest.release().await.unwrap();
    let fourth = granted(waiting, "the fourth permit").await;
    assert!(fourth.token() > third.token());
    let holders = one.holders(&key, Primitive::Semaphore).await.unwrap();
    let listed: Vec<_> = holders.iter().map(|h| h.token).collect();
    assert_eq!(listed, [second.token(), third.token(), fourth.token()]);
    assert!(holders
        .iter()
        .all(|h| h.kind == HoldKind::Permit { limit: 3 } && h.waiters == Some(0)));
    for permit in [second, third, fourth] {
        permit.release().await.unwrap();
    }
    let backend = connect(&zk_url(&[server.addr()], "")).await;
    assert!(backend.stored_keys(&key).await.unwrap().is_empty());
}

/// A semaphore larger than the waiter watches node by node: a release of any holder still
/// wakes it (through the queue's children).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_semaphores_waiter_wakes_on_any_release() {
    let server = start_zookeeper().await;
    let key = key("large");
    let limit = 20;
    let holder = client(server.addr()).await;
    let mut permits = Vec::new();
    for _ in 0..limit {
        permits.push(holder.semaphore(&key, limit).await.unwrap());
    }
    let late = client(server.addr()).await;
    let waiting = spawn_take(&late, &key, HoldKind::Permit { limit });
    queued(&holder, &key, Primitive::Semaphore, 1).await;
    permits.remove(7).release().await.unwrap();
    let last = granted(waiting, "the waiter of a 20-permit semaphore").await;
    last.release().await.unwrap();
    for permit in permits {
        permit.release().await.unwrap();
    }
}

/// A request with another limit than the semaphore's holders and waiters is refused with
/// `InvalidInput` naming both limits, waiting or not, and leaves no node; once the
/// semaphore is empty the new limit is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_that_disagrees_is_refused_naming_both() {
    let server = start_zookeeper().await;
    let key = key("limits");
    let holder = client(server.addr()).await;
    let other = client(server.addr()).await;
    let held = holder.semaphore(&key, 2).await.unwrap();
    for attempt in [
        other.semaphore(&key, 7).no_wait().await,
        other.semaphore(&key, 7).options(watched()).await,
    ] {
        let err = attempt.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let message = err.to_string();
        assert!(
            message.contains("limit of 2") && message.contains("asked for 7"),
            "{message}"
        );
    }
    let parent = format!("/distlock/{key}.semaphore");
    until(PROMPT, "the refused nodes are gone", || async {
        children(server.addr(), &parent).await.len() == 1
    })
    .await;
    held.release().await.unwrap();
    let changed = other.semaphore(&key, 7).no_wait().await.unwrap();
    changed.release().await.unwrap();
}

/// Readers share, a writer waits for them and is woken by the last one's release; readers
/// that come after the waiting writer queue behind it (FIFO: a try is refused, a waiter
/// waits) and are woken by its release; tokens follow the grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_later_readers() {
    let server = start_zookeeper().await;
    let key = key("rw");
    let readers = client(server.addr()).await;
    let first = readers.read_lock(&key).await.unwrap();
    let second = readers.read_lock(&key).no_wait().await.unwrap();
    let nodes = children(server.addr(), &format!("/distlock/{key}.rwlock")).await;
    assert!(nodes.iter().all(|n| n.contains("-read-")), "{nodes:?}");
    let writers = client(server.addr()).await;
    let err = writers.write_lock(&key).no_wait().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
    let writing = spawn_take(&writers, &key, HoldKind::Write);
    queued(&readers, &key, Primitive::RwLock, 1).await;
    let late = client(server.addr()).await;
    let err = late.read_lock(&key).no_wait().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err}");
    let reading = spawn_take(&late, &key, HoldKind::Read);
    queued(&readers, &key, Primitive::RwLock, 2).await;
    let reader_tokens = first.token().max(second.token());
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = granted(writing, "the writer").await;
    assert!(writer.token() > reader_tokens);
    assert!(!reading.is_finished(), "a reader holds with the writer");
    let holders = late.holders(&key, Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, HoldKind::Write);
    assert_eq!(holders[0].token, writer.token());
    assert_eq!(holders[0].waiters, Some(1));
    let writer_token = writer.token();
    writer.release().await.unwrap();
    let reader = granted(reading, "the reader behind the writer").await;
    assert!(reader.token() > writer_token);
    reader.release().await.unwrap();
    let backend = connect(&zk_url(&[server.addr()], "")).await;
    assert!(backend.stored_keys(&key).await.unwrap().is_empty());
}

/// Waiters that give up (a bounded wait that runs out) leave no node behind, a writer
/// neither: readers are not held back by a writer that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_nothing() {
    let server = start_zookeeper().await;
    let key = key("give-up");
    let holder = client(server.addr()).await;
    let other = client(server.addr()).await;
    let permit = holder.semaphore(&key, 1).await.unwrap();
    let reader = holder.read_lock(&key).await.unwrap();
    let bound = Duration::from_millis(300);
    let err = other
        .semaphore(&key, 1)
        .wait_up_to(bound)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    let err = other.write_lock(&key).wait_up_to(bound).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    for parent in ["semaphore", "rwlock"] {
        let parent = format!("/distlock/{key}.{parent}");
        until(PROMPT, "a waiter's node is gone", || async {
            children(server.addr(), &parent).await.len() == 1
        })
        .await;
    }
    // No writer is left queued ahead of a new reader.
    let second = other.read_lock(&key).no_wait().await.unwrap();
    second.release().await.unwrap();
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    let backend = connect(&zk_url(&[server.addr()], "")).await;
    until(PROMPT, "nothing stored", || async {
        backend.stored_keys(&key).await.unwrap().is_empty()
    })
    .await;
}

/// Eight clients take permits of a two-permit semaphore over and over: never more than
/// two inside at once, and every token is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_never_exceed_the_limit() {
    let server = start_zookeeper().await;
    let key = key("concurrent");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let client = client(server.addr()).await;
        let (key, inside, most) = (key.clone(), inside.clone(), most.clone());
        workers.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..5 {
                let permit = client
                    .semaphore(&key, 2)
                    .wait_up_to(Duration::from_secs(60))
                    .await
                    .unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.push(permit.token());
                // Held a moment, so that permits overlap.
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
            assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for worker in workers {
        tokens.extend(worker.await.unwrap());
    }
    assert!(most.load(Ordering::SeqCst) <= 2, "{most:?} inside at once");
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "the permits never overlapped"
    );
    let count = tokens.len();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "a token was granted twice");
    let backend = connect(&zk_url(&[server.addr()], "")).await;
    assert!(backend.stored_keys(&key).await.unwrap().is_empty());
}

/// A retried acquisition of a lease that already holds (its reply was lost) answers the
/// same grant, the same token, for each kind; a later grant's token is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_grant_answers_the_same_token() {
    let server = start_zookeeper().await;
    let backend = connect(&zk_url(&[server.addr()], "")).await;
    let ttl = Duration::from_secs(10);
    let name = LockKey::new(key("retry")).unwrap();
    let mut last = None;
    for kind in [
        HoldKind::Permit { limit: 2 },
        HoldKind::Write,
        HoldKind::Read,
    ] {
        let request = AcquireRequest::new(
            name.held_as(kind).unwrap(),
            ttl,
            default_drift_allowance(ttl),
            Renewal::Auto,
        );
        let first = backend.acquire_once(&request, ttl).await.unwrap();
        let again = backend.acquire_once(&request, ttl).await.unwrap();
        assert_eq!(first.token(), again.token(), "{kind:?}");
        assert!(last.is_none_or(|last| first.token() > last), "{kind:?}");
        last = Some(first.token());
        backend.release_lease(&again, ttl).await.unwrap();
    }
}
