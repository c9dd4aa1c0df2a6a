//! The shared-hold rules on the memory store, in every mode, through the client.

use std::collections::HashSet;
use std::future::{Future, IntoFuture};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::backend::{
    async_trait, lock_unpoisoned as lock, AcquireRequest, Capabilities, Grant, HolderInfo,
    KeyWatch, LockBackend, Ownership, Turn,
};
use crate::{
    ErrorKind, FencingToken, HoldKind, LeaseId, LockClient, LockGuard, LockKey, MemoryBackend,
    Primitive, Renewal, Result,
};

/// Every mode of the store: plain, fair, and each with sessions.
fn modes() -> Vec<(&'static str, MemoryBackend)> {
    vec![
        ("plain", MemoryBackend::new()),
        ("fair", MemoryBackend::fair()),
        ("plain sessions", MemoryBackend::new().with_sessions()),
        ("fair sessions", MemoryBackend::fair().with_sessions()),
    ]
}

/// Another process's client of `store`.
fn client(store: &MemoryBackend) -> LockClient {
    LockClient::new(store.client())
}

fn key(name: &str, kind: HoldKind) -> LockKey {
    LockKey::new(name).unwrap().held_as(kind).unwrap()
}

/// Live waiters the store keeps for `key`'s primitive: its fair queue, or the intents of
/// writers that wait.
fn waiting(store: &MemoryBackend, key: &LockKey) -> usize {
    let state = lock(&store.store.state);
    let alive = state.alive(crate::values::clock::now());
    state
        .slots
        .get(&super::slots::slot_key(key))
        .map_or(0, |slot| {
            slot.waiters.iter().filter(|w| w.lives(alive)).count()
        })
}

/// Polls `check` until it holds, failing after 5 s: for state the test cannot await.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = crate::values::clock::now() + Duration::from_secs(5);
    while !check() {
        assert!(
            crate::values::clock::now() < deadline,
            "{what}: not within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The outcome of `task`, which must end within 5 s.
async fn finished<T>(what: &str, task: JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 5 s"))
        .unwrap()
}

fn spawned<F>(future: F) -> JoinHandle<Result<LockGuard>>
where
    F: IntoFuture<Output = Result<LockGuard>>,
    F::IntoFuture: Future<Output = Result<LockGuard>> + Send + 'static,
{
    tokio::spawn(future.into_future())
}

fn refused<T: std::fmt::Debug>(result: Result<T>) -> ErrorKind {
    result.unwrap_err().kind()
}

async fn stored(store: &MemoryBackend) -> Vec<String> {
    store.stored_keys("").await.unwrap()
}

async fn holders(client: &LockClient, name: &str, primitive: Primitive) -> Vec<FencingToken> {
    client
        .holders(name, primitive)
        .await
        .unwrap()
        .into_iter()
        .map(|status| status.token)
        .collect()
}

#[tokio::test]
async fn a_semaphore_admits_its_limit_and_no_more() {
    for (mode, store) in modes() {
        let clients: Vec<LockClient> = (0..4).map(|_| client(&store)).collect();
        let mut permits = Vec::new();
        for client in &clients[..3] {
            permits.push(client.semaphore("gpu", 3).no_wait().await.unwrap());
        }
        let fourth = clients[3].semaphore("gpu", 3).no_wait().await;
        assert_eq!(refused(fourth), ErrorKind::HeldByAnother, "{mode}");
        let tokens: Vec<FencingToken> = permits.iter().map(LockGuard::token).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{mode}: {tokens:?}");
        let seen = clients[3]
            .holders("gpu", Primitive::Semaphore)
            .await
            .unwrap();
        assert_eq!(
            seen.iter().map(|s| s.token).collect::<Vec<_>>(),
            tokens,
            "{mode}: holders oldest first"
        );
        assert!(seen.iter().all(|s| s.kind == HoldKind::Permit { limit: 3 }));
        assert!(
            clients[3].inspect("gpu").await.unwrap().is_none(),
            "{mode}: the mutex of that name is another key"
        );
        // One permit back: the fourth gets in, the others keep theirs.
        permits.remove(1).release().await.unwrap();
        let fourth = clients[3].semaphore("gpu", 3).no_wait().await.unwrap();
        assert!(fourth.token() > tokens[2], "{mode}");
        assert_eq!(
            holders(&clients[0], "gpu", Primitive::Semaphore).await,
            vec![tokens[0], tokens[2], fourth.token()],
            "{mode}"
        );
        for permit in permits.into_iter().chain([fourth]) {
            permit.release().await.unwrap();
        }
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

#[tokio::test]
async fn a_limit_other_than_the_holders_is_invalid_input_naming_both() {
    for (mode, store) in modes() {
        let (first, second) = (client(&store), client(&store));
        let held = first.semaphore("k", 3).await.unwrap();
        let other = second.semaphore("k", 4).no_wait().await.unwrap_err();
        assert_eq!(other.kind(), ErrorKind::InvalidInput, "{mode}");
        assert!(
            other
                .to_string()
                .contains(r#"semaphore "k" has 3 permits; asked with 4"#),
            "{mode}: {other}"
        );
        // Waiting does not help: the limit is wrong, not the moment.
        let waited = second.semaphore("k", 4).wait_up_to(Duration::from_secs(5));
        assert_eq!(refused(waited.await), ErrorKind::InvalidInput, "{mode}");
        held.release().await.unwrap();
        // Nobody holds the semaphore any more: the next holder sets its limit.
        let renewed = second.semaphore("k", 4).no_wait().await.unwrap();
        assert_eq!(
            refused(first.semaphore("k", 3).no_wait().await),
            ErrorKind::InvalidInput,
            "{mode}"
        );
        renewed.release().await.unwrap();
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

#[tokio::test]
async fn readers_share_and_exclude_the_writer() {
    for (mode, store) in modes() {
        let (a, b, c) = (client(&store), client(&store), client(&store));
        let first = a.read_lock("doc").no_wait().await.unwrap();
        let second = b.read_lock("doc").no_wait().await.unwrap();
        let write = c.write_lock("doc").no_wait().await;
        assert_eq!(refused(write), ErrorKind::HeldByAnother, "{mode}");
        let kinds: Vec<HoldKind> = c
            .holders("doc", Primitive::RwLock)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.kind)
            .collect();
        assert_eq!(kinds, [HoldKind::Read, HoldKind::Read], "{mode}");
        first.release().await.unwrap();
        let write = c.write_lock("doc").no_wait().await;
        assert_eq!(refused(write), ErrorKind::HeldByAnother, "{mode}");
        let last_read = second.token();
        second.release().await.unwrap();
        let writer = c.write_lock("doc").no_wait().await.unwrap();
        assert!(writer.token() > last_read, "{mode}");
        for other in [&a, &b] {
            assert_eq!(
                refused(other.read_lock("doc").no_wait().await),
                ErrorKind::HeldByAnother,
                "{mode}"
            );
            assert_eq!(
                refused(other.write_lock("doc").no_wait().await),
                ErrorKind::HeldByAnother,
                "{mode}"
            );
        }
        // The mutex and the semaphore of that name are other keys.
        a.try_lock("doc").await.unwrap().release().await.unwrap();
        let permit = a.semaphore("doc", 1).no_wait().await.unwrap();
        writer.release().await.unwrap();
        let reader = b.read_lock("doc").no_wait().await.unwrap();
        assert!(reader.token() > permit.token(), "{mode}: one counter");
        reader.release().await.unwrap();
        permit.release().await.unwrap();
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

/// A writer that waits keeps new readers out (on every store: intents on the plain ones,
/// the queue on the fair ones), gets the lock when the last reader leaves, and readers
/// get in again once it has had its turn or given up, either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_new_readers() {
    for (mode, store) in modes() {
        let rw = key("doc", HoldKind::Write);
        let (reader, writer, late) = (client(&store), client(&store), client(&store));
        let held = reader.read_lock("doc").await.unwrap();

        // Gives up by dropping its future.
        let waiting_writer = spawned(writer.write_lock("doc"));
        until(mode, || waiting(&store, &rw) == 1).await;
        let late_read = late.read_lock("doc").no_wait().await;
        assert_eq!(refused(late_read), ErrorKind::HeldByAnother, "{mode}");
        waiting_writer.abort();
        until(mode, || waiting(&store, &rw) == 0).await;
        late.read_lock("doc")
            .no_wait()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();

        // Gives up when its wait runs out.
        let bounded = writer.write_lock("doc").wait_up_to(Duration::from_secs(2));
        let timed_out = spawned(bounded);
        until(mode, || waiting(&store, &rw) == 1).await;
        assert_eq!(
            refused(late.read_lock("doc").no_wait().await),
            ErrorKind::HeldByAnother,
            "{mode}"
        );
        let gave_up = finished(mode, timed_out).await;
        assert_eq!(refused(gave_up), ErrorKind::TimedOut, "{mode}");
        until(mode, || waiting(&store, &rw) == 0).await;
        late.read_lock("doc")
            .no_wait()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();

        // Has its turn when the reader leaves; readers waiting behind it follow.
        let waiting_writer = spawned(writer.write_lock("doc"));
        until(mode, || waiting(&store, &rw) == 1).await;
        let waiting_reader = spawned(late.read_lock("doc"));
        held.release().await.unwrap();
        let written = finished(mode, waiting_writer).await.unwrap();
        let read_token = written.token();
        written.release().await.unwrap();
        let read = finished(mode, waiting_reader).await.unwrap();
        assert!(read.token() > read_token, "{mode}");
        read.release().await.unwrap();
        until(mode, || waiting(&store, &rw) == 0).await;
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

/// A single try of a writer leaves nothing behind to keep readers out.
#[tokio::test]
async fn a_writers_single_try_leaves_no_intent() {
    for (mode, store) in modes() {
        let (reader, writer) = (client(&store), client(&store));
        let held = reader.read_lock("doc").await.unwrap();
        let tried = writer.write_lock("doc").no_wait().await;
        assert_eq!(refused(tried), ErrorKind::HeldByAnother, "{mode}");
        assert_eq!(waiting(&store, &key("doc", HoldKind::Write)), 0, "{mode}");
        let another = reader.read_lock("doc").no_wait().await.unwrap();
        another.release().await.unwrap();
        held.release().await.unwrap();
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

/// On a fair store, waiters of every kind are served in arrival order: the readers at the
/// head of the queue together, a writer alone, and nobody overtakes a writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_store_serves_mixed_waiters_in_arrival_order() {
    for (mode, store) in [
        ("fair", MemoryBackend::fair()),
        ("fair sessions", MemoryBackend::fair().with_sessions()),
    ] {
        let rw = key("doc", HoldKind::Read);
        let holder = client(&store);
        let first_writer = holder.write_lock("doc").await.unwrap();
        let mut tasks = Vec::new();
        for (at, read) in [true, true, false, true].into_iter().enumerate() {
            let waiter = client(&store);
            tasks.push(if read {
                spawned(waiter.read_lock("doc"))
            } else {
                spawned(waiter.write_lock("doc"))
            });
            until(mode, || waiting(&store, &rw) == at + 1).await;
        }
        let mut tasks = tasks.into_iter();
        let (r1, r2, w3, r4) = (
            tasks.next().unwrap(),
            tasks.next().unwrap(),
            tasks.next().unwrap(),
            tasks.next().unwrap(),
        );
        // A try has the whole queue ahead of it.
        let late = client(&store);
        assert_eq!(
            refused(late.read_lock("doc").no_wait().await),
            ErrorKind::HeldByAnother,
            "{mode}"
        );
        let written = first_writer.token();
        first_writer.release().await.unwrap();
        // Admitted together: which of the two goes first is theirs to race for.
        let (r1, r2) = (
            finished(mode, r1).await.unwrap(),
            finished(mode, r2).await.unwrap(),
        );
        assert!(r1.token() > written && r2.token() > written, "{mode}");
        assert!(!w3.is_finished() && !r4.is_finished(), "{mode}");
        assert_eq!(waiting(&store, &rw), 2, "{mode}");
        let (read, written) = (r1.token().max(r2.token()), w3);
        r1.release().await.unwrap();
        assert!(!written.is_finished(), "{mode}: a reader still holds");
        r2.release().await.unwrap();
        let w3 = finished(mode, written).await.unwrap();
        assert!(w3.token() > read, "{mode}");
        assert!(!r4.is_finished(), "{mode}");
        let written = w3.token();
        w3.release().await.unwrap();
        let r4 = finished(mode, r4).await.unwrap();
        assert!(r4.token() > written, "{mode}");
        r4.release().await.unwrap();
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

/// On a fair store a permit waits behind the permits queued before it, even when one is
/// free for a moment, and a try does not overtake them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_semaphore_grants_permits_in_arrival_order() {
    let store = MemoryBackend::fair();
    let sem = key("pool", HoldKind::Permit { limit: 2 });
    let clients: Vec<LockClient> = (0..5).map(|_| client(&store)).collect();
    let a = clients[0].semaphore("pool", 2).await.unwrap();
    let b = clients[1].semaphore("pool", 2).await.unwrap();
    let third = spawned(clients[2].semaphore("pool", 2));
    until("third queued", || waiting(&store, &sem) == 1).await;
    let fourth = spawned(clients[3].semaphore("pool", 2));
    until("fourth queued", || waiting(&store, &sem) == 2).await;
    // A queued waiter's limit is the semaphore's too.
    assert_eq!(
        refused(clients[4].semaphore("pool", 5).no_wait().await),
        ErrorKind::InvalidInput
    );
    a.release().await.unwrap();
    let third = finished("third", third).await.unwrap();
    let try_now = clients[4].semaphore("pool", 2).no_wait().await;
    assert_eq!(refused(try_now), ErrorKind::HeldByAnother);
    assert!(!fourth.is_finished());
    b.release().await.unwrap();
    let fourth = finished("fourth", fourth).await.unwrap();
    assert!(third.token() < fourth.token());
    third.release().await.unwrap();
    fourth.release().await.unwrap();
    assert!(stored(&store).await.is_empty());
}

/// A release that lets several waiters in lets every one in, not one per poll: each grant
/// wakes the next (plain stores), or every admitted waiter is woken (fair ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_lets_every_waiting_reader_in() {
    for (mode, store) in modes() {
        let holder = client(&store);
        let writer = holder.write_lock("doc").await.unwrap();
        // Polls come half a minute apart at the soonest (a fair waiter polls at least
        // three times a TTL): only wake-ups let the readers in in time.
        let slow = crate::AcquireOptions {
            ttl: Duration::from_secs(600),
            backoff: crate::Backoff {
                initial: Duration::from_secs(60),
                max: Duration::from_secs(60),
            },
            ..crate::AcquireOptions::default()
        };
        let refused = Arc::new(Mutex::new(HashSet::new()));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let link = Refusals {
                    store: store.client(),
                    refused: Arc::clone(&refused),
                };
                let reader = LockClient::new(link).with_defaults(slow.clone());
                spawned(reader.read_lock("doc"))
            })
            .collect();
        // Each reader watches the key from before its first attempt: once every one was
        // refused, all of them wait for a wake-up.
        until(mode, || lock(&refused).len() == 4).await;
        writer.release().await.unwrap();
        for reader in readers {
            finished(mode, reader)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

/// A client of the memory store that notes which leases were refused a grant.
#[derive(Debug)]
struct Refusals {
    store: MemoryBackend,
    refused: Arc<Mutex<HashSet<LeaseId>>>,
}

impl Refusals {
    fn note<T>(&self, request: &AcquireRequest, refused: bool, answer: T) -> T {
        if refused {
            lock(&self.refused).insert(request.lease_id());
        }
        answer
    }
}

#[async_trait]
impl LockBackend for Refusals {
    fn name(&self) -> &'static str {
        "refusals"
    }
    fn capabilities(&self) -> &Capabilities {
        self.store.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let answer = self.store.try_acquire(request).await;
        self.note(request, matches!(answer, Ok(None)), answer)
    }
    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.store.renew(key, lease_id, ttl).await
    }
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.store.release(key, lease_id).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        self.store.inspect(key).await
    }
    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        self.store.watch(key).await
    }
    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        self.store.enqueue(request).await
    }
    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        let answer = self.store.try_acquire_queued(request).await;
        self.note(request, matches!(answer, Ok(Turn::Waiting)), answer)
    }
    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        self.store.leave_queue(key, lease_id).await
    }
    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        self.store.watch_turn(request).await
    }
}

/// Backend-level rules the client does not show: a retry by the same lease answers the
/// same grant, and renew and release act on the one entry of the lease.
#[tokio::test]
async fn retries_renewals_and_releases_act_on_one_lease() {
    for (mode, store) in modes() {
        let sem = key("k", HoldKind::Permit { limit: 2 });
        let request = |renewal| {
            AcquireRequest::new(
                sem.clone(),
                Duration::from_secs(30),
                Duration::ZERO,
                renewal,
            )
        };
        let first = request(Renewal::Manual);
        let token = store.try_acquire(&first).await.unwrap().unwrap().token();
        let again = store.try_acquire(&first).await.unwrap().unwrap().token();
        assert_eq!(again, token, "{mode}: a retry answers the same grant");
        let second = request(Renewal::Manual);
        let other = store.try_acquire(&second).await.unwrap().unwrap().token();
        assert!(other > token, "{mode}");
        assert!(store
            .try_acquire(&request(Renewal::Manual))
            .await
            .unwrap()
            .is_none());
        let ttl = Duration::from_secs(60);
        assert!(store
            .renew(&sem, first.lease_id(), ttl)
            .await
            .unwrap()
            .is_held());
        assert!(store
            .release(&sem, first.lease_id())
            .await
            .unwrap()
            .is_held());
        assert!(!store
            .renew(&sem, first.lease_id(), ttl)
            .await
            .unwrap()
            .is_held());
        assert!(!store
            .release(&sem, first.lease_id())
            .await
            .unwrap()
            .is_held());
        let left = store.holders(&sem).await.unwrap();
        assert_eq!(left.len(), 1, "{mode}");
        assert_eq!(
            (left[0].lease_id, left[0].token),
            (second.lease_id(), other)
        );
        assert_eq!(store.inspect(&sem).await.unwrap().unwrap().token, other);
        assert!(store
            .release(&sem, second.lease_id())
            .await
            .unwrap()
            .is_held());
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
}

/// Holders and writers' intents that expire are swept like a mutex's: they stop counting
/// at once, and leave nothing stored once the key is touched again.
#[tokio::test]
async fn expired_holders_and_intents_stop_counting() {
    for (mode, store) in [
        ("plain", MemoryBackend::new()),
        ("fair", MemoryBackend::fair()),
    ] {
        let short = Duration::from_millis(50);
        let request =
            |kind| AcquireRequest::new(key("k", kind), short, Duration::ZERO, Renewal::Manual);
        let permit = request(HoldKind::Permit { limit: 1 });
        assert!(store.try_acquire(&permit).await.unwrap().is_some());
        let reader = request(HoldKind::Read);
        assert!(store.try_acquire(&reader).await.unwrap().is_some());
        let writer = request(HoldKind::Write).waiting(true);
        assert!(store.try_acquire(&writer).await.unwrap().is_none());
        let intents = usize::from(!store.capabilities().fair_ordering);
        assert_eq!(waiting(&store, writer.key()), intents, "{mode}");
        let sem = key("k", HoldKind::Permit { limit: 1 });
        until(mode, || {
            let state = lock(&store.store.state);
            let alive = state.alive(crate::values::clock::now());
            !state
                .slots
                .values()
                .flat_map(|slot| &slot.holders)
                .any(|e| e.lives(alive))
        })
        .await;
        assert!(store.holders(&sem).await.unwrap().is_empty(), "{mode}");
        let next = request(HoldKind::Permit { limit: 1 });
        assert!(store.try_acquire(&next).await.unwrap().is_some(), "{mode}");
        let late_reader = request(HoldKind::Read);
        assert!(
            store.try_acquire(&late_reader).await.unwrap().is_some(),
            "{mode}"
        );
        for request in [&next, &late_reader] {
            let released = store.release(request.key(), request.lease_id()).await;
            assert!(released.unwrap().is_held(), "{mode}");
        }
        assert!(
            stored(&store).await.is_empty(),
            "{mode}: {:?}",
            stored(&store).await
        );
    }
}

/// A session the store ends frees the shared holds of that session, and only those.
#[tokio::test]
async fn an_ended_session_frees_its_shared_holds() {
    for (mode, store) in [
        ("plain sessions", MemoryBackend::new().with_sessions()),
        ("fair sessions", MemoryBackend::fair().with_sessions()),
    ] {
        let (a, b) = (client(&store), client(&store));
        // Kept alive every few hundred ms: the client hears of the end soon.
        let short = Duration::from_secs(1);
        let a_read = a.read_lock("doc").ttl(short).await.unwrap();
        let b_read = b.read_lock("doc").await.unwrap();
        let a_permit = a.semaphore("pool", 1).ttl(short).await.unwrap();
        assert!(
            store.end_session_holding(&key("doc", HoldKind::Read)),
            "{mode}"
        );
        let left = holders(&b, "doc", Primitive::RwLock).await;
        assert_eq!(left, vec![b_read.token()], "{mode}");
        let taken = b.semaphore("pool", 1).no_wait().await.unwrap();
        assert_eq!(
            finished(mode, tokio::spawn(a_read.lost())).await,
            crate::LossReason::SessionEnded,
            "{mode}"
        );
        drop((a_read, a_permit));
        taken.release().await.unwrap();
        b_read.release().await.unwrap();
        until(mode, || lock(&store.store.state).slots.is_empty()).await;
    }
}

/// A set is taken in one step on a store without a queue: every key or none, a refused
/// set changing nothing, a retry answering the same grants.
#[tokio::test]
async fn a_set_is_taken_whole_or_not_at_all() {
    for (mode, store) in [
        ("plain", MemoryBackend::new()),
        ("plain sessions", MemoryBackend::new().with_sessions()),
    ] {
        assert!(store.capabilities().atomic_sets, "{mode}");
        let requests: Vec<AcquireRequest> = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                let key = key(name, HoldKind::Mutex);
                AcquireRequest::new(key, Duration::from_secs(30), Duration::ZERO, Renewal::Auto)
                    .waiting(true)
            })
            .collect();
        let blocker = client(&store);
        let held = blocker.lock("b").await.unwrap();
        assert!(store.try_acquire_all(&requests).await.unwrap().is_none());
        assert_eq!(
            stored(&store).await,
            ["b"],
            "{mode}: the refused set left nothing"
        );
        held.release().await.unwrap();
        let tokens = |grants: Vec<crate::backend::Grant>| -> Vec<FencingToken> {
            grants.iter().map(crate::backend::Grant::token).collect()
        };
        let granted = tokens(store.try_acquire_all(&requests).await.unwrap().unwrap());
        assert!(
            granted.windows(2).all(|w| w[0] < w[1]),
            "{mode}: {granted:?}"
        );
        let again = tokens(store.try_acquire_all(&requests).await.unwrap().unwrap());
        assert_eq!(again, granted, "{mode}: a retry answers the same grants");
        let twice = [requests[0].clone(), requests[0].clone()];
        let refused = store.try_acquire_all(&twice).await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{mode}");
        for request in &requests {
            let released = store.release(request.key(), request.lease_id()).await;
            assert!(released.unwrap().is_held(), "{mode}");
        }
        assert!(stored(&store).await.is_empty(), "{mode}");
    }
    assert!(!MemoryBackend::fair().capabilities().atomic_sets);
}
