//! ZooKeeper-specific faults: a lost creation reply, a missing chroot, a killed leader,
//! sessions ending under a waiter or a manual lease. Partitions, freezes, restarts, killed
//! holder processes, refused credentials, hostile keys and unreachable ensembles in
//! general are conformance scenarios.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use conformance_tests::harness::{granted_within, spawn_lock};
use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::SLACK;
use lock_core::backend::default_drift_allowance;
use lock_core::backend::{with_timeout, AcquireRequest, LockBackendExt, QueuedAttempt};
use lock_core::{AcquireOptions, Backoff, ErrorKind, LockClient, LockKey, Renewal, Wait};

use support::{connect, start_zookeeper, zk_url};

/// Options of a rival that polls fast, so its grant is seen within milliseconds.
fn rival_options(wait: Duration) -> AcquireOptions {
    AcquireOptions {
        wait: Wait::UpTo(wait),
        backoff: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(10),
        },
        ..AcquireOptions::default()
    }
}

fn key(name: &str) -> String {
    format!("faults-{:016x}/{name}", fastrand::u64(..))
}

/// A creation whose request reached the server but whose reply was lost: the retry with
/// the same lease id finds its node by name instead of leaving an orphan that would block
/// the queue (CURATOR-79).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_whose_reply_is_lost_leaves_no_orphan() {
    let server = start_zookeeper().await;
    let proxy = TcpFaultProxy::start(server.addr()).await.unwrap();
    let backend = connect(&zk_url(&[proxy.addr()], "")).await;
    let observer = connect(&zk_url(&[server.addr()], "")).await;
    let key = LockKey::new(key("lost-reply")).unwrap();
    let ttl = Duration::from_secs(10);
    let request =
        |renewal| AcquireRequest::new(key.clone(), ttl, default_drift_allowance(ttl), renewal);
    // The observer holds the key, so the parent exists and the creation queues.
    let held = observer
        .acquire_once(&request(Renewal::Manual), ttl)
        .await
        .unwrap();
    let queued = request(Renewal::Auto);
    // Opens the session first, so the cut catches the creation itself.
    let warm = request(Renewal::Auto);
    with_timeout("zookeeper", ttl, "enqueue", backend.enqueue(&warm))
        .await
        .unwrap();
    backend.leave_queue(&key, warm.lease_id()).await.unwrap();
    proxy.set_mode(ProxyMode::CutReplies);
    let lost = with_timeout(
        "zookeeper",
        Duration::from_millis(300),
        "enqueue",
        backend.enqueue(&queued),
    )
    .await;
    assert_eq!(lost.unwrap_err().kind(), ErrorKind::Unavailable);
    let waiters = || async { observer.inspect(&key).await.unwrap().unwrap().waiters };
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiters().await != Some(1) {
        assert!(Instant::now() < deadline, "the creation never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.set_mode(ProxyMode::Pass);
    with_timeout("zookeeper", ttl, "enqueue", backend.enqueue(&queued))
        .await
        .unwrap();
    assert_eq!(waiters().await, Some(1), "the retry left a second node");
    observer.release_lease(&held, ttl).await.unwrap();
    let granted = backend.acquire_queued_once(&queued, ttl).await.unwrap();
    let QueuedAttempt::Granted(lease) = granted else {
        panic!("the retried node did not get its turn: {granted:?}");
    };
    let info = observer.inspect(&key).await.unwrap().unwrap();
    assert_eq!((info.lease_id, info.waiters), (lease.id(), Some(0)));
    backend.release_lease(&lease, ttl).await.unwrap();
    assert!(observer.inspect(&key).await.unwrap().is_none());
}

/// A chroot that does not exist is `Misconfigured`: no retry will create it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chroot_is_misconfigured() {
    let server = start_zookeeper().await;
    let missing = format!("zk://{}/missing?{}", server.addr(), support::test_options());
    let err = lock_zk::connect(&missing).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err:?}");
}

/// The ensemble's leader is killed while a lock is held: the holder keeps its lock (its
/// session moves to another member), or sees `lost()` before anyone else gets the key;
/// either way tokens keep increasing, also after the old leader is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_or_loses_the_lock_safely() {
    let mut servers = support::start_ensemble().await;
    let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
    let url = zk_url(&addrs, "");
    let holder = LockClient::new(connect(&url).await);
    let rival = LockClient::new(connect(&url).await);
    let key = key("leader-kill");
    let ttl = Duration::from_secs(2);
    let guard = holder.lock(&key).ttl(ttl).await.unwrap();
    let mut leader = None;
    for (index, addr) in addrs.iter().enumerate() {
        if conformance_tests::store_process::zookeeper_mode(*addr)
            .await
            .is_ok_and(|mode| mode == "leader")
        {
            leader = Some(index);
        }
    }
    let leader = leader.expect("the ensemble has a leader");
    servers[leader].kill().unwrap();
    let waiting = spawn_lock(rival.clone(), &key, rival_options(Duration::from_secs(60)));
    let watch_until = Instant::now() + ttl * 3;
    while Instant::now() < watch_until && !waiting.is_finished() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let old_token = guard.token();
    if waiting.is_finished() {
        let (taken, got_at) = granted_within(SLACK, "rival", waiting).await.unwrap();
        assert!(
            guard.lease().valid_until() <= got_at,
            "a rival got the key while its holder still trusted it"
        );
        assert!(!guard.is_held());
        assert!(taken.token() > old_token);
        taken.release().await.unwrap();
    } else {
        assert!(
            guard.is_held(),
            "the holder lost the lock, yet nobody took it"
        );
        guard.release().await.unwrap();
        let (taken, _) = granted_within(ttl * 5, "rival", waiting).await.unwrap();
        assert!(taken.token() > old_token);
        taken.release().await.unwrap();
    }
    servers[leader].restart().await.unwrap();
    let again = rival.lock(&key).ttl(ttl).await.unwrap();
    assert!(again.token() > old_token);
    again.release().await.unwrap();
}

/// A queued waiter whose session ends while it waits (its link cut past the timeout) queues
/// again under a new session once the link is back, and still gets the key: neither the
/// client's "no response from connection" error nor the ended session ends the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_ended_queues_again() {
    let server = start_zookeeper().await;
    let proxy = TcpFaultProxy::start(server.addr()).await.unwrap();
    let waiter = LockClient::new(connect(&zk_url(&[proxy.addr()], "")).await);
    let holder = LockClient::new(connect(&zk_url(&[server.addr()], "")).await);
    let observer = connect(&zk_url(&[server.addr()], "")).await;
    let key = key("waiter-session");
    let lock_key = LockKey::new(&key).unwrap();
    let ttl = Duration::from_millis(600);
    let held = holder.lock(&key).ttl(ttl).await.unwrap();
    let options = AcquireOptions {
        ttl,
        ..rival_options(Duration::from_secs(30))
    };
    let waiting = spawn_lock(waiter, &key, options);
    let queued = |n: usize| {
        let (observer, lock_key) = (observer.clone(), lock_key.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while observer
                .inspect(&lock_key)
                .await
                .unwrap()
                .and_then(|info| info.waiters)
                != Some(n)
            {
                assert!(Instant::now() < deadline, "never {n} waiting");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    queued(1).await;
    proxy.set_mode(ProxyMode::BlackHole);
    // The server ends the waiter's session, and its node goes with it.
    queued(0).await;
    proxy.set_mode(ProxyMode::Pass);
    queued(1).await;
    held.release().await.unwrap();
    let (guard, _) = granted_within(Duration::from_secs(10), "waiter", waiting)
        .await
        .unwrap();
    guard.release().await.unwrap();
}

/// A server without TTL nodes (ZooKeeper's default): the backend says at connect that it
/// keeps no idempotency records, so an idempotent run is refused before its work runs,
/// instead of running the work and failing at the record (and running it again on every
/// retry). Nor can it keep a once ticket's hold outside a session: once is refused too.
/// Locks work as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_ttl_nodes_refuses_idempotent_runs_and_once_tickets() {
    let server = conformance_tests::store_process::StoreProcess::start(
        conformance_tests::store_process::StoreSpec::zookeeper_without_ttl_nodes(),
    )
    .await
    .unwrap();
    let backend = connect(&zk_url(&[server.addr()], "")).await;
    let client = LockClient::new(backend.clone());
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&ran);
    let run = client
        .idempotent(key("no-ttl"))
        .run(move |_| async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(Vec::new())
        })
        .await;
    let runs = ran.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(runs, 0, "the work ran ({:?})", run.map(|_| ()));
    let refused = run.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Unsupported);
    assert!(
        refused
            .to_string()
            .contains("-Dzookeeper.extendedTypesEnabled=true"),
        "the refusal names the setting: {refused}"
    );
    assert!(!backend.capabilities().records);
    assert!(!backend.capabilities().once_holds());
    let once = client.once(key("no-ttl-once")).await;
    assert_eq!(once.map(|_| ()).unwrap_err().kind(), ErrorKind::Unsupported);
    let guard = client.lock(key("no-ttl-lock")).await.unwrap();
    guard.release().await.unwrap();

    // The test servers have TTL nodes: there the backend keeps records and once holds.
    let with_ttl = start_zookeeper().await;
    let capabilities = connect(&zk_url(&[with_ttl.addr()], ""))
        .await
        .capabilities()
        .clone();
    assert!(capabilities.records && capabilities.detached_holds);
}

/// A lease renewed by hand that is not renewed is ended by its client, which deletes its
/// node; the session it lives in is shared and kept alive. When that delete fails (the
/// link is torn down just then) and the link comes back before the server ends the
/// session, the delete is retried: the key is free again, instead of blocked for as long
/// as the client lives. (At the backend level: the core's own release of a lost lease is
/// retried too, and would hide whether the backend retries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_manual_lease_is_deleted_once_the_link_is_back() {
    let server = start_zookeeper().await;
    let proxy = TcpFaultProxy::start(server.addr()).await.unwrap();
    let holder = connect(&zk_url(&[proxy.addr()], "")).await;
    let rival = LockClient::new(connect(&zk_url(&[server.addr()], "")).await);
    let key = LockKey::new(key("manual-cut")).unwrap();
    let ttl = Duration::from_secs(3);
    let request = AcquireRequest::new(
        key.clone(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    );
    let lease = holder.acquire_once(&request, ttl).await.unwrap();
    // Silences the link shortly before the lease's end, so the client's delete goes out
    // and stays unanswered; then tears the connection down, which fails the delete, and
    // heals the link well within the session's timeout, so the session lives on (and,
    // without a retry, the node with it).
    let end = tokio::time::Instant::from_std(lease.valid_until());
    tokio::time::sleep_until(end - ttl / 10).await;
    proxy.set_mode(ProxyMode::BlackHole);
    tokio::time::sleep_until(end + ttl / 20).await;
    proxy.set_mode(ProxyMode::Reset);
    tokio::time::sleep(ttl / 20).await;
    proxy.set_mode(ProxyMode::Pass);
    let taken = rival
        .lock(key.as_str())
        .wait_up_to(ttl * 3)
        .await
        .expect("the key is free once the link is back");
    assert!(taken.token() > lease.token());
    taken.release().await.unwrap();
}

/// A waiter queued behind a once ticket's node gets the key once the ticket's `at_most`
/// has passed, not before, by its own judgment of the node's end (a write of its own node
/// tells it the server's time): the server itself would keep the node for `max_ttl_ms`
/// after its creation. The ticket's client is gone by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_once_ticket_gets_the_key_at_its_end() {
    let server = start_zookeeper().await;
    let url = zk_url(&[server.addr()], "");
    let first = LockClient::new(connect(&url).await);
    let waiter = LockClient::new(connect(&url).await);
    let key = key("once-waiter");
    let at_most = Duration::from_secs(1);
    let started = Instant::now();
    let ticket = first
        .once(&key)
        .at_most(at_most)
        .await
        .unwrap()
        .expect("a free key gives a ticket");
    let token = ticket.token();
    first.shutdown().await.unwrap();
    drop((ticket, first));
    let waiting = spawn_lock(waiter, &key, rival_options(Duration::from_secs(20)));
    let (guard, granted_at) = granted_within(at_most * 10, "the waiter", waiting)
        .await
        .unwrap();
    let taken_at = granted_at.duration_since(started);
    assert!(
        taken_at >= at_most,
        "granted {taken_at:?} after the ticket, before at_most {at_most:?}"
    );
    assert!(
        taken_at < at_most + SLACK * 2,
        "granted only {taken_at:?} after the ticket, at_most {at_most:?}"
    );
    assert!(guard.token() > token);
    guard.release().await.unwrap();
}
