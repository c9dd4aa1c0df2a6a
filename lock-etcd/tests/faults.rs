//! etcd-specific faults: unreachable endpoints with credentials, other servers on the
//! port, retried record writes, the leases of detached holds, late writes and a role on
//! the prefix. Partitions,
//! freezes, restarts, killed holder processes, wrong passwords and unreachable endpoints
//! in general are conformance scenarios.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use conformance_tests::network::closed_addr;
use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::{everything_shown, SLACK};
use lock_core::backend::{AcquireRequest, LockBackendExt, Record};
use lock_core::{ErrorKind, LeaseId, LockClient, LockKey, Renewal};
use support::{connect, etcd_url, etcdctl, start_etcd};

const TTL: Duration = Duration::from_secs(2);

async fn client(url: &str) -> LockClient {
    LockClient::new(connect(url).await)
}

/// Nothing listening, or a listener that accepts and never answers, with credentials
/// (authenticating is a request of its own): `Unavailable` within the connect time-out,
/// however long the request time-out is. (Without credentials:
/// `silent_store_is_unavailable_within_the_connect_timeout`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoints_are_unavailable_within_the_connect_timeout() {
    let silent = TcpFaultProxy::start(closed_addr().unwrap()).await.unwrap();
    silent.set_mode(ProxyMode::BlackHole);
    for addr in [closed_addr().unwrap(), silent.addr()] {
        for user in ["u:p@"] {
            let url = format!(
                "etcd://{user}{addr}/distlock-test?connect_timeout_ms=300&request_timeout_ms=5000"
            );
            let started = Instant::now();
            let err = lock_etcd::connect(&url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{url}: {err:?}");
            assert!(
                started.elapsed() <= Duration::from_millis(300) + SLACK,
                "{url}: gave up after {:?}",
                started.elapsed()
            );
        }
    }
}

/// A listener that answers every connection with an HTTP/1 error, then closes it or keeps
/// it open (reading on) as a keep-alive HTTP/1 server does.
async fn http1_server(keep_open: bool) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let reply =
                    "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let _ = conn.write_all(reply.as_bytes()).await;
                while keep_open && matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// Another server on the port (an HTTP/1 server, a Redis): refused quickly as not an etcd
/// server, never as an internal error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_kind_of_server_is_not_taken_for_etcd() {
    let redis = conformance_tests::store_process::StoreProcess::start(
        conformance_tests::store_process::StoreSpec::redis(),
    )
    .await
    .unwrap();
    for addr in [
        http1_server(false).await,
        http1_server(true).await,
        redis.addr(),
    ] {
        for user in ["u:p@"] {
            let url = format!(
                "etcd://{user}{addr}/distlock-test?connect_timeout_ms=1000&request_timeout_ms=5000"
            );
            let started = Instant::now();
            let err = lock_etcd::connect(&url).await.unwrap_err();
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::Unavailable | ErrorKind::Misconfigured
                ),
                "{url}: {err:?}"
            );
            assert!(
                err.to_string().contains("not an etcd server"),
                "{url}: {}",
                everything_shown(&err)
            );
            assert!(
                started.elapsed() <= Duration::from_millis(1000) + SLACK,
                "{url}: gave up after {:?}",
                started.elapsed()
            );
        }
    }
}

/// A record write retried (the idempotent layer retries one whose reply was lost) reuses
/// the record's etcd lease, so no lease per retry waits out the retention with nothing on
/// it; the record lives by one lease that outlives the retention by at most an eighth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_record_writes_leave_one_lease() {
    let server = start_etcd().await;
    let backend = connect(&etcd_url(&[server.addr()], "")).await;
    let mut raw = raw_client(&server).await;
    let key = LockKey::new("records").unwrap();
    let lease = LeaseId::random();
    let request = AcquireRequest::new(key.clone(), TTL * 5, Duration::ZERO, Renewal::Manual)
        .with_lease_id(lease);
    let token = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .unwrap()
        .token();
    let record = Record {
        value: b"done".to_vec(),
        fingerprint: None,
        token,
    };
    let retention = Duration::from_secs(3600);
    let before = raw.leases().await.unwrap().leases().len();
    for _ in 0..3 {
        assert!(backend
            .write_record(&key, lease, &record, retention)
            .await
            .unwrap()
            .is_held());
    }
    let leases: Vec<i64> = raw
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    assert_eq!(
        leases.len(),
        before + 1,
        "three writes of one record left {} new leases",
        leases.len() - before
    );
    let mut record_leases = Vec::new();
    for id in leases {
        let found = raw
            .lease_client()
            .time_to_live(
                id,
                Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
            )
            .await
            .unwrap();
        // Not the session's lease (`TTL * 5`).
        if found.granted_ttl() >= 3600 {
            assert!(
                found.ttl() >= 3600 && found.granted_ttl() <= 3600 + 3600 / 8 + 1,
                "the record's lease has {} s left of {} s",
                found.ttl(),
                found.granted_ttl()
            );
            record_leases.push(found.keys().len());
        }
    }
    assert_eq!(record_leases, [1], "the record's lease and what it holds");
    assert_eq!(
        backend.read_record(&key).await.unwrap(),
        Some(record.clone())
    );
    let _ = backend.release(&key, lease).await.unwrap();
}

/// A shared record lease that etcd no longer has (revoked by hand here) is replaced by
/// the next write, which succeeds, instead of failing every write of that retention for
/// the rest of its reuse window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_lease_revoked_by_hand_is_replaced() {
    let server = start_etcd().await;
    let backend = connect(&etcd_url(&[server.addr()], "")).await;
    let mut raw = raw_client(&server).await;
    let key = LockKey::new("revoked").unwrap();
    let request = AcquireRequest::new(key.clone(), TTL * 5, Duration::ZERO, Renewal::Manual);
    let lease = backend.acquire_once(&request, TTL).await.unwrap();
    let record = Record {
        value: b"done".to_vec(),
        fingerprint: None,
        token: lease.token(),
    };
    let retention = Duration::from_secs(60);
    let write = || backend.write_record(&key, lease.id(), &record, retention);
    assert!(write().await.unwrap().is_held());
    // The record's lease is the one with the record on it that outlives the session's.
    let record_lease = |found: &BTreeMap<i64, (i64, usize)>| {
        found
            .iter()
            .find(|(_, (granted, keys))| *granted >= 60 && *keys == 1)
            .map(|(id, _)| *id)
    };
    let first = record_lease(&leases(&mut raw).await).unwrap();
    raw.lease_revoke(first).await.unwrap();
    assert_eq!(backend.read_record(&key).await.unwrap(), None);
    assert!(write().await.unwrap().is_held());
    assert_eq!(
        backend.read_record(&key).await.unwrap(),
        Some(record.clone())
    );
    let second = record_lease(&leases(&mut raw).await).unwrap();
    assert_ne!(second, first);
    let _ = backend.release(&key, lease.id()).await.unwrap();
}

/// A plain etcd client of `server`, to look behind the backend's back.
async fn raw_client(
    server: &conformance_tests::store_process::StoreProcess,
) -> etcd_client::Client {
    etcd_client::Client::connect([server.addr().to_string()], None)
        .await
        .unwrap()
}

/// The etcd leases on the server, each with its granted TTL and how many keys are on it.
async fn leases(raw: &mut etcd_client::Client) -> BTreeMap<i64, (i64, usize)> {
    let mut found = BTreeMap::new();
    let ids: Vec<i64> = raw
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    for id in ids {
        let options = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
        let lease = raw
            .lease_client()
            .time_to_live(id, Some(options))
            .await
            .unwrap();
        if lease.ttl() > 0 {
            found.insert(id, (lease.granted_ttl(), lease.keys().len()));
        }
    }
    found
}

/// A detached hold (a once ticket) is an entry on an etcd lease of its own, which no
/// session of the client keeps: a retried acquisition keeps that lease and its token,
/// dropping the client leaves it, `expire_in` moves the entry to a new lease of the asked
/// TTL with the same create revision (the fencing token) and revokes the old one, and a
/// release revokes the hold's lease, so no lease is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_hold_lives_on_leases_of_its_own() {
    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let mut raw = raw_client(&server).await;
    let key = LockKey::new("ticket").unwrap();
    let lease_id = LeaseId::random();
    let request = AcquireRequest::new(key.clone(), TTL * 5, Duration::ZERO, Renewal::Manual)
        .with_lease_id(lease_id)
        .detached();

    // A client that took the hold and went: the hold stays, on a lease of its own.
    let gone = connect(&url).await;
    let grant = gone.try_acquire(&request).await.unwrap().unwrap();
    assert!(
        grant.session().is_none(),
        "a detached grant lives by no session"
    );
    drop(gone);
    let held: Vec<(i64, usize)> = leases(&mut raw).await.into_values().collect();
    assert_eq!(
        held,
        [(10, 1)],
        "the hold's lease, and its entry, outlive the client"
    );

    let first = leases(&mut raw).await;
    let first: Vec<i64> = first.into_keys().collect();

    // A retry from a client that never saw the first attempt's lease (as one that forgot
    // it): the entry moves to this attempt's lease, which counts from now.
    let backend = connect(&url).await;
    let retried = backend.try_acquire(&request).await.unwrap().unwrap();
    assert_eq!(retried.token(), grant.token(), "a retry keeps the token");
    let on = |leases: BTreeMap<i64, (i64, usize)>| -> Vec<(i64, usize)> {
        leases.into_values().filter(|(_, keys)| *keys > 0).collect()
    };
    let moved = leases(&mut raw).await;
    assert_eq!(moved[&first[0]], (10, 0), "the entry left the first lease");
    assert_eq!(on(moved.clone()), [(10, 1)]);
    // Retried again: the same lease, restarted.
    let retried = backend.try_acquire(&request).await.unwrap().unwrap();
    assert_eq!(retried.token(), grant.token());
    assert_eq!(
        leases(&mut raw).await,
        moved,
        "a retry grants no other lease"
    );

    assert!(backend
        .expire_in(&key, lease_id, Duration::from_secs(3))
        .await
        .unwrap()
        .is_held());
    let info = backend.inspect(&key).await.unwrap().unwrap();
    assert_eq!((info.lease_id, info.token), (lease_id, grant.token()));
    assert!(info.remaining_ttl <= Duration::from_secs(3), "{info:?}");
    let now = leases(&mut raw).await;
    assert_eq!(now.len(), 2, "the hold's former lease was revoked: {now:?}");
    assert_eq!(
        on(now),
        [(3, 1)],
        "the entry moved to a lease of the asked TTL"
    );

    assert!(backend.release(&key, lease_id).await.unwrap().is_held());
    assert!(backend.inspect(&key).await.unwrap().is_none());
    assert!(!backend
        .expire_in(&key, lease_id, Duration::from_secs(3))
        .await
        .unwrap()
        .is_held());
    let left: Vec<i64> = leases(&mut raw).await.into_keys().collect();
    assert_eq!(
        left, first,
        "only the first client's emptied lease is left, to run out"
    );
}

/// Review N2 (c): an acquisition that lands in etcd after both of the core's clean-up
/// releases (one at once, one a request time-out later) must not leave an entry on the
/// client's shared session, which lives as long as the client: a third client gets the key
/// within a few seconds, and the late grant is refused in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_landing_after_its_clean_ups_leaves_no_entry() {
    use conformance_tests::{Fault, FaultyBackend, Op};
    use lock_core::{AcquireOptions, Wait};

    let server = start_etcd().await;
    let url = etcd_url(&[server.addr()], "");
    let faulty = FaultyBackend::new(connect(&url).await);
    let rival = client(&url).await;
    let late = LockClient::new(faulty.clone());
    let key = "late-landing";
    // The client has locked before, so its shared session of this TTL is alive, as it is
    // in any client that a late write could come from.
    late.lock("warm-up")
        .ttl(TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let request_timeout = Duration::from_millis(500);
    // After the release at once and the second one a request time-out after it.
    let landing = request_timeout * 2 + Duration::from_millis(1500);
    faulty.inject_times(Op::Acquire, Fault::LandLate(landing), 1);
    let options = AcquireOptions {
        ttl: TTL,
        wait: Wait::No,
        request_timeout,
        ..AcquireOptions::default()
    };
    let releases_before = faulty.completed(Op::Release);
    let abandoned = late.lock(key).options(options).await;
    assert!(abandoned.is_err(), "the late attempt was answered in time");
    let deadline = Instant::now() + landing + SLACK * 4;
    while faulty.landed() == 0 {
        assert!(Instant::now() < deadline, "the late attempt never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        faulty.completed(Op::Release) >= releases_before + 2,
        "the attempt landed before both clean-up releases were answered; the test proves nothing"
    );
    let taken = rival
        .lock(key)
        .ttl(TTL)
        .wait_up_to(TTL * 3)
        .await
        .expect("a third client gets the key: the late acquisition blocks it");
    taken.release().await.unwrap();
    assert!(
        rival.inspect(key).await.unwrap().is_none(),
        "an entry is left"
    );
}

/// Review N2 (c), as raft would do it: a transaction sent, its caller gone before the
/// answer, the acquisition cleaned up, and then the same transaction (same etcd lease,
/// same lease id) reaching the store again. The clean-up of an unanswered acquisition
/// leaves a tombstone even though it found (and deleted) the entry, so the late copy writes
/// nothing, and the client's session is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_write_cannot_land_after_its_clean_up() {
    let server = start_etcd().await;
    let proxy = TcpFaultProxy::start(server.addr()).await.unwrap();
    let backend = connect(&etcd_url(&[proxy.addr()], "")).await;
    let observer = client(&etcd_url(&[server.addr()], "")).await;
    // The client's shared session of this TTL is open, as it is for any write that was
    // sent with it; this lock on it shows it survives.
    let warm = AcquireRequest::new(
        LockKey::new("warm-up").unwrap(),
        TTL,
        Duration::ZERO,
        Renewal::Auto,
    );
    let warm_token = backend.try_acquire(&warm).await.unwrap().unwrap().token();
    for queued in [false, true] {
        let key = LockKey::new(format!("unanswered-{queued}")).unwrap();
        let request = AcquireRequest::new(key.clone(), TTL, Duration::ZERO, Renewal::Auto);
        // Replies come back a second after the store applied the write: the caller gives
        // up once the store has it, before the answer.
        proxy.set_mode(ProxyMode::Delay(Duration::from_millis(500)));
        let landed = async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while observer.inspect(key.as_str()).await.unwrap().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "the write never reached the store"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let write = async {
            if queued {
                backend.enqueue(&request).await.map(|()| None)
            } else {
                backend.try_acquire(&request).await
            }
        };
        tokio::select! {
            answered = write => panic!("the delayed write was answered: {answered:?}"),
            () = landed => {}
        }
        proxy.set_mode(ProxyMode::Pass);
        // The core's clean-up, which finds the entry the unanswered write made.
        if queued {
            backend.leave_queue(&key, request.lease_id()).await.unwrap();
            let late = backend.enqueue(&request).await;
            assert!(late.is_err(), "the late copy was queued");
        } else {
            assert!(backend
                .release(&key, request.lease_id())
                .await
                .unwrap()
                .is_held());
            let late = backend.try_acquire(&request).await.unwrap();
            assert!(late.is_none(), "the late copy was granted the key");
        }
        assert!(
            observer.inspect(key.as_str()).await.unwrap().is_none(),
            "the late copy left an entry (queued: {queued})"
        );
    }
    let warm_now = observer.inspect("warm-up").await.unwrap();
    assert_eq!(
        warm_now.map(|held| held.token),
        Some(warm_token),
        "the client's session ended"
    );
    assert!(backend
        .release(warm.key(), warm.lease_id())
        .await
        .unwrap()
        .is_held());
}

/// A role granted the prefix as a string prefix is enough for every operation, the
/// tombstone compare of each acquisition included; one granted only `<prefix>/` is refused
/// with `PermissionDenied` (the docs say which to grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_on_the_prefix_is_enough() {
    let server = start_etcd().await;
    let addrs = [server.addr()];
    for args in [
        &["user", "add", "root:R00t-pass", "--interactive=false"][..],
        &["user", "add", "app:App-pass", "--interactive=false"],
        &["user", "add", "narrow:Narrow-pass", "--interactive=false"],
        &["role", "add", "locks"],
        &["role", "add", "narrow"],
        &[
            "role",
            "grant-permission",
            "locks",
            "readwrite",
            "locks",
            "--prefix",
        ],
        &[
            "role",
            "grant-permission",
            "narrow",
            "readwrite",
            "locks/",
            "--prefix",
        ],
        &["user", "grant-role", "app", "locks"],
        &["user", "grant-role", "narrow", "narrow"],
        &["auth", "enable"],
    ] {
        etcdctl(&addrs, args).await;
    }
    let options = "request_timeout_ms=2000&min_ttl_ms=1000";
    let app = format!("etcd://app:App-pass@{}/locks?{options}", server.addr());
    let app = LockClient::new(lock_etcd::connect(&app).await.unwrap());
    let guard = app.lock("k").ttl(TTL).await.unwrap();
    assert_eq!(app.list("", 10).await.unwrap().len(), 1);
    guard.release().await.unwrap();
    let narrow = format!(
        "etcd://narrow:Narrow-pass@{}/locks?{options}",
        server.addr()
    );
    let narrow = LockClient::new(lock_etcd::connect(&narrow).await.unwrap());
    let refused = narrow.lock("k").ttl(TTL).await;
    assert_eq!(
        refused.map(drop).unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
}
