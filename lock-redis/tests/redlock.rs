//! Redlock over five private servers behind fault proxies: every subset of nodes cut off,
//! a node frozen mid-acquire, fencing tokens across majorities that differ, what a failed
//! attempt leaves behind, reconnection over a slow link, and wake-ups.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::{eventually, within, Failure};
use futures_util::{FutureExt, StreamExt};
use lock_core::backend::{default_drift_allowance, AcquireRequest, DynBackend, LockBackend};
use lock_core::{ErrorKind, FencingToken, LeaseId, LockKey, Renewal};
use lock_redis::{RedisConfig, RedlockBackend};
use support::{entry, lock_key, proxies, raw, redlock_url, start_redis_nodes, REDLOCK_NODES};

const TTL: Duration = Duration::from_secs(5);
/// Short enough that 32 subsets run in a few seconds. Connecting runs in the background
/// and outlives the operation that started it, so its bound is kept below the node
/// time-out: a connect begun into a black hole (whose bytes the proxy discards for good)
/// has then given up before the next operation on a healed node needs a fresh one.
const FAST: &str = "node_timeout_ms=60&connect_timeout_ms=30";

fn request(key: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        LockKey::new(key).unwrap(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    )
}

fn key(name: &str) -> String {
    format!("redlock-{:08x}/{name}", fastrand::u32(..))
}

fn cut(proxies: &[TcpFaultProxy], mask: u32) {
    for (index, proxy) in proxies.iter().enumerate() {
        let mode = if mask & (1 << index) != 0 {
            ProxyMode::BlackHole
        } else {
            ProxyMode::Pass
        };
        proxy.set_mode(mode);
    }
}

async fn through_proxies(proxies: &[TcpFaultProxy]) -> DynBackend {
    let addrs: Vec<SocketAddr> = proxies.iter().map(TcpFaultProxy::addr).collect();
    support::connect(&redlock_url(&addrs, FAST)).await
}

/// For each of the 32 subsets of cut-off nodes, acquisition succeeds exactly when at least
/// three of five nodes are reachable, and otherwise fails as unavailable (never as held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_exactly_with_a_reachable_majority() {
    let servers = start_redis_nodes(REDLOCK_NODES).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&addrs).await;
    let backend = through_proxies(&proxies).await;
    let base = key("subset");
    for mask in 0u32..(1 << REDLOCK_NODES) {
        let reachable = REDLOCK_NODES - mask.count_ones() as usize;
        cut(&proxies, mask);
        let request = request(&format!("{base}/{mask:05b}"), TTL);
        let started = Instant::now();
        let outcome = backend.try_acquire(&request).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "mask {mask:05b} took {took:?}"
        );
        if reachable >= 3 {
            let token = outcome.unwrap_or_else(|e| panic!("mask {mask:05b}: {e}"));
            assert!(token.is_some(), "mask {mask:05b}: held by another?");
            assert!(backend
                .release(request.key(), request.lease_id())
                .await
                .unwrap()
                .is_held());
        } else {
            let err = outcome.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "mask {mask:05b}: {err}");
        }
    }
    cut(&proxies, 0);
}

/// A node frozen (SIGSTOP) while acquisitions run costs each quorum operation at most the
/// node time-out; locking, renewing and releasing go on with the other four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_frozen_mid_acquire() {
    let servers = start_redis_nodes(REDLOCK_NODES).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let backend = support::connect(&redlock_url(&addrs, FAST)).await;
    let key = key("frozen");
    let mut last = FencingToken::new(0);
    let rounds = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            let mut tokens = Vec::new();
            for _ in 0..40 {
                let request = request(&key, TTL);
                if let Some(grant) = backend.try_acquire(&request).await.unwrap() {
                    tokens.push(grant.token());
                    assert!(backend
                        .renew(request.key(), request.lease_id(), TTL)
                        .await
                        .unwrap()
                        .is_held());
                    assert!(backend
                        .release(request.key(), request.lease_id())
                        .await
                        .unwrap()
                        .is_held());
                }
            }
            tokens
        }
    });
    // Freeze node 2 while the loop is running, whatever operation it is in.
    tokio::task::yield_now().await;
    servers[2].pause().unwrap();
    let tokens = rounds.await.unwrap();
    servers[2].resume().unwrap();
    assert_eq!(tokens.len(), 40, "some acquisitions failed");
    for token in tokens {
        assert!(token > last, "{token} after {last}");
        last = token;
    }
}

/// Tokens strictly increase across acquisitions whose majorities differ, including
/// majorities that contain nodes which missed every earlier grant: the second round writes
/// each token back to a majority, and any two majorities share a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_differing_majorities() {
    let servers = start_redis_nodes(REDLOCK_NODES).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&addrs).await;
    let backend = through_proxies(&proxies).await;
    let key = key("majorities");
    // Each cuts two nodes, so every majority is the other three, and consecutive majorities
    // overlap in exactly one node; {3,4} then {0,1} leaves only node 2 carrying the history.
    let cuts = [
        0b11000u32, 0b00011, 0b01100, 0b10001, 0b00110, 0b11000, 0b01010, 0b10100,
    ];
    let mut last = 0;
    for (round, mask) in cuts.into_iter().enumerate() {
        cut(&proxies, mask);
        // Half the rounds hand over by release, half by expiry (takeover).
        let ttl = if round % 2 == 0 {
            TTL
        } else {
            Duration::from_millis(300)
        };
        let request = request(&key, ttl);
        let started = Instant::now();
        let token = loop {
            match backend.try_acquire(&request).await.unwrap() {
                Some(grant) => break grant.token(),
                None => assert!(started.elapsed() < Duration::from_secs(3), "never free"),
            }
        };
        assert!(
            token.get() > last,
            "round {round}: token {token} after {last}"
        );
        last = token.get();
        if round % 2 == 0 {
            assert!(backend
                .release(request.key(), request.lease_id())
                .await
                .unwrap()
                .is_held());
        }
    }
    cut(&proxies, 0);
}

/// A lease's entry on a server, read behind the backend's back.
async fn holds(server: SocketAddr, redis_key: &str, lease: LeaseId) -> bool {
    entry(server, redis_key)
        .await
        .is_some_and(|e| e.starts_with(&format!("{lease}:")))
}

/// Puts another lease's entry on `server`, as a rival holding the key there would.
async fn hold_elsewhere(server: SocketAddr, redis_key: &str) {
    let () = redis::cmd("SET")
        .arg(redis_key)
        .arg(format!("{}:9:1", "f".repeat(32)))
        .arg("PX")
        .arg(60_000)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
}

async fn delete(server: SocketAddr, redis_key: &str) {
    let _: i64 = redis::cmd("DEL")
        .arg(redis_key)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
}

/// The `(id, arguments)` of every call of the script `sha` in the server's slow log, which
/// the test set to record every command.
async fn script_calls(server: SocketAddr, sha: &str) -> Vec<(i64, Vec<String>)> {
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
    let mut calls = Vec::new();
    for record in log {
        let redis::Value::Array(fields) = record else {
            continue;
        };
        let id: i64 = redis::from_redis_value(fields[0].clone()).unwrap();
        let args: Vec<String> = redis::from_redis_value(fields[3].clone()).unwrap();
        if args.len() > 1 && args[0].eq_ignore_ascii_case("evalsha") && args[1] == sha {
            calls.push((id, args));
        }
    }
    calls
}

/// Makes the server's slow log record every command, with the clean-up script cached so
/// that each clean-up is exactly one `EVALSHA` there (not also one refused with NOSCRIPT).
async fn log_every_command(server: SocketAddr) {
    support::config_set(server, "slowlog-log-slower-than", "0").await;
    support::config_set(server, "slowlog-max-len", "10000").await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(include_str!("../scripts/discard.lua"))
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
}

/// A partial grant on nodes 0 and 1 (node 2 held by a rival, nodes 3 and 4 cut off):
/// starts the attempt, and once its entries are on nodes 0 and 1 (round 1 answered there),
/// switches those two proxies to `then` before the attempt's clean-up is sent. Returns
/// what the attempt returned.
async fn partial_grant_then(
    backend: &RedlockBackend,
    servers: &[SocketAddr],
    proxies: &[TcpFaultProxy],
    request: &AcquireRequest,
    redis_key: &str,
    then: ProxyMode,
) -> lock_core::Result<Option<FencingToken>> {
    hold_elsewhere(servers[2], redis_key).await;
    proxies[3].set_mode(ProxyMode::BlackHole);
    proxies[4].set_mode(ProxyMode::BlackHole);
    let attempt = tokio::spawn({
        let (backend, request) = (backend.clone(), request.clone());
        async move { backend.try_acquire(&request).await }
    });
    eventually(
        Duration::from_secs(1),
        "round 1 on nodes 0 and 1",
        || async {
            Ok::<_, Failure>(
                holds(servers[0], redis_key, request.lease_id()).await
                    && holds(servers[1], redis_key, request.lease_id()).await,
            )
        },
    )
    .await
    .unwrap();
    proxies[0].set_mode(then);
    proxies[1].set_mode(then);
    let granted = attempt.await.unwrap()?;
    Ok(granted.map(|grant| grant.token()))
}

fn discard_sha() -> String {
    redis::Script::new(include_str!("../scripts/discard.lua"))
        .get_hash()
        .to_string()
}

fn slow_url(addrs: &[SocketAddr], prefix: &str) -> String {
    redlock_url(
        addrs,
        &format!(
            "key_prefix={prefix}&node_timeout_ms=300&response_timeout_ms=400&connect_timeout_ms=100"
        ),
    )
}

async fn connect(url: &str) -> RedlockBackend {
    RedlockBackend::connect(&RedisConfig::from_url(url).unwrap())
        .await
        .unwrap()
}

/// S2 through the network: an attempt's clean-up of nodes 0 and 1 is held up in transit
/// (its connections are given up on, its bytes still on the way); the lease's next attempt
/// succeeds on nodes 0, 1 and 2; then the old clean-up lands. The lease must survive it:
/// no rival forms a majority while the holder believes it holds the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_up_that_lands_late_spares_the_next_attempts_grant() {
    let processes = start_redis_nodes(REDLOCK_NODES).await;
    let servers: Vec<SocketAddr> = processes.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&servers).await;
    for server in &servers[..2] {
        log_every_command(*server).await;
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(TcpFaultProxy::addr).collect();
    let prefix = "late-clean-up:";
    let backend = connect(&slow_url(&addrs, prefix)).await;
    let key = key("late-clean-up");
    let redis_key = lock_key(prefix, &key);
    let request = request(&key, Duration::from_secs(30));
    let sha = discard_sha();

    let held_up = ProxyMode::Delay(Duration::from_secs(2));
    let first = partial_grant_then(&backend, &servers, &proxies, &request, &redis_key, held_up);
    assert_eq!(first.await.unwrap(), None);
    for proxy in &proxies[..2] {
        proxy.set_mode(ProxyMode::Pass);
    }
    delete(servers[2], &redis_key).await;
    // The clean-up gives up on the held connections and tries again on fresh ones, which
    // arrive at once; the first bytes are still on their way.
    eventually(Duration::from_secs(5), "the retried clean-up", || async {
        Ok::<_, Failure>(
            !script_calls(servers[0], &sha).await.is_empty()
                && !script_calls(servers[1], &sha).await.is_empty(),
        )
    })
    .await
    .unwrap();
    let stamp = script_calls(servers[0], &sha).await[0].1[5].clone();

    // The lease's next attempt wins nodes 0, 1 and 2 (3 and 4 are still cut off).
    assert!(backend.try_acquire(&request).await.unwrap().is_some());
    eventually(
        Duration::from_secs(5),
        "the late clean-up lands",
        || async {
            for server in &servers[..2] {
                let calls = script_calls(*server, &sha).await;
                if calls.iter().filter(|(_, args)| args[5] == stamp).count() < 2 {
                    return Ok(false);
                }
            }
            Ok::<_, Failure>(true)
        },
    )
    .await
    .unwrap();

    let rival = connect(&slow_url(&servers, prefix)).await;
    assert!(
        rival
            .try_acquire(&self::request(&key, TTL))
            .await
            .unwrap()
            .is_none(),
        "a rival formed a majority while the lease was held"
    );
    assert!(holds(servers[0], &redis_key, request.lease_id()).await);
    assert!(holds(servers[1], &redis_key, request.lease_id()).await);
    cut(&proxies, 0);
    assert!(backend
        .release(request.key(), request.lease_id())
        .await
        .unwrap()
        .is_held());
}

/// L8: an attempt that took a minority and gave up (the `try_lock` case) cleans up after
/// itself even when its clean-up could not get through at first: the pending entries go
/// once the partition heals, not a TTL later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_grant_is_cleaned_up_once_the_partition_heals() {
    let processes = start_redis_nodes(REDLOCK_NODES).await;
    let servers: Vec<SocketAddr> = processes.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&servers).await;
    let addrs: Vec<SocketAddr> = proxies.iter().map(TcpFaultProxy::addr).collect();
    let prefix = "partial-grant:";
    let backend = connect(&slow_url(&addrs, prefix)).await;
    let key = key("partial");
    let redis_key = lock_key(prefix, &key);
    let request = request(&key, Duration::from_secs(30));

    let cut_off = ProxyMode::BlackHole;
    let first = partial_grant_then(&backend, &servers, &proxies, &request, &redis_key, cut_off);
    assert_eq!(first.await.unwrap(), None, "the key is held");
    assert!(holds(servers[0], &redis_key, request.lease_id()).await);
    cut(&proxies, 0);
    eventually(Duration::from_secs(5), "nodes 0 and 1 freed", || async {
        Ok::<_, Failure>(
            !holds(servers[0], &redis_key, request.lease_id()).await
                && !holds(servers[1], &redis_key, request.lease_id()).await,
        )
    })
    .await
    .unwrap();
}

/// L5: cleaning up after a failed attempt publishes nothing (nothing was held, so a
/// wake-up would only send waiters at a key that is still taken); a release does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempts_clean_up_wakes_no_one() {
    let processes = start_redis_nodes(REDLOCK_NODES).await;
    let servers: Vec<SocketAddr> = processes.iter().map(|s| s.addr()).collect();
    let prefix = "quiet-clean-up:";
    let backend = connect(&redlock_url(&servers, &format!("key_prefix={prefix}"))).await;
    let mut pubsub = redis::Client::open(format!("redis://{}/0", servers[0]))
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(format!("{prefix}released")).await.unwrap();
    let mut messages = pubsub.into_on_message();
    let key = key("quiet");
    let redis_key = lock_key(prefix, &key);

    for server in &servers[2..] {
        hold_elsewhere(*server, &redis_key).await;
    }
    let failed = request(&key, TTL);
    assert!(backend.try_acquire(&failed).await.unwrap().is_none());
    eventually(Duration::from_secs(5), "the clean-up of node 0", || async {
        Ok::<_, Failure>(!holds(servers[0], &redis_key, failed.lease_id()).await)
    })
    .await
    .unwrap();
    for server in &servers[2..] {
        delete(*server, &redis_key).await;
    }
    let taken = request(&key, TTL);
    assert!(backend.try_acquire(&taken).await.unwrap().is_some());
    assert!(backend
        .release(taken.key(), taken.lease_id())
        .await
        .unwrap()
        .is_held());

    let first = within(Duration::from_secs(5), "a message", messages.next())
        .await
        .unwrap()
        .unwrap();
    let payload: String = first.get_payload().unwrap();
    assert_eq!(payload, format!("{redis_key}\n{}", taken.lease_id()));
}

/// L5: every node that held a lease announces its release; a client hears it as one
/// release and wakes one of its waiters, not one per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter_of_a_client() {
    let processes = start_redis_nodes(REDLOCK_NODES).await;
    let servers: Vec<SocketAddr> = processes.iter().map(|s| s.addr()).collect();
    let prefix = "one-wake:";
    let url = redlock_url(&servers, &format!("key_prefix={prefix}"));
    let (waiters, holder) = (connect(&url).await, connect(&url).await);
    let key = key("one-wake");
    let taken = request(&key, TTL);
    assert!(holder.try_acquire(&taken).await.unwrap().is_some());
    let mut first = waiters.watch(taken.key()).await.unwrap().unwrap();
    let mut second = waiters.watch(taken.key()).await.unwrap().unwrap();
    assert!(holder
        .release(taken.key(), taken.lease_id())
        .await
        .unwrap()
        .is_held());
    within(Duration::from_secs(5), "the first waiter", first.changed())
        .await
        .unwrap()
        .unwrap();

    // Each node's messages arrive in order: once a marker published on every node after
    // the release has been heard, so has every node's announcement of the release.
    let mut markers = Vec::new();
    for (index, server) in servers.iter().enumerate() {
        let marker = LockKey::new(format!("{key}/marker-{index}")).unwrap();
        markers.push(waiters.watch(&marker).await.unwrap().unwrap());
        let message = format!("{}\nmarker", lock_key(prefix, marker.as_str()));
        // As many copies as a release needs announcements to count.
        for _ in 0..waiters.quorum() {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(format!("{prefix}released"))
                .arg(&message)
                .query_async(&mut raw(*server).await)
                .await
                .unwrap();
        }
    }
    for marker in &mut markers {
        within(Duration::from_secs(5), "a marker", marker.changed())
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        second.changed().now_or_never().is_none(),
        "one release woke two waiters of one client"
    );
}

/// L6: a waiter's subscription never waits for a node that does not answer: watching
/// returns at once, whatever the state of the subscriptions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_does_not_wait_for_an_unreachable_node() {
    let processes = start_redis_nodes(REDLOCK_NODES).await;
    let servers: Vec<SocketAddr> = processes.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&servers).await;
    proxies[0].set_mode(ProxyMode::BlackHole);
    let addrs: Vec<SocketAddr> = proxies.iter().map(TcpFaultProxy::addr).collect();
    let backend = connect(&redlock_url(&addrs, "connect_timeout_ms=1000")).await;
    let key = LockKey::new(key("watch")).unwrap();
    within(Duration::from_millis(50), "watch", backend.watch(&key))
        .await
        .unwrap()
        .unwrap();
    cut(&proxies, 0);
}

/// L2: over a link whose round trip (120 ms) fits the node time-out (200 ms) but whose
/// connect-and-set-up does not, a node whose connection was given up on once (one slow
/// reply) is used again: reconnecting is not cut short by the operations waiting for it.
/// With two other nodes cut off, an acquisition succeeds only if node 0 answers in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reconnects_when_connecting_takes_longer_than_the_node_timeout() {
    let processes = start_redis_nodes(REDLOCK_NODES).await;
    let servers: Vec<SocketAddr> = processes.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&servers).await;
    // Scripts are cached on the servers first: loading one costs extra round trips.
    let direct = connect(&redlock_url(&servers, "")).await;
    let warm_up = request(&key("warm-up"), TTL);
    assert!(direct.try_acquire(&warm_up).await.unwrap().is_some());
    assert!(direct
        .release(warm_up.key(), warm_up.lease_id())
        .await
        .unwrap()
        .is_held());
    let link = ProxyMode::Delay(Duration::from_millis(60));
    for proxy in &proxies {
        proxy.set_mode(link);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(TcpFaultProxy::addr).collect();
    let backend = connect(&redlock_url(&addrs, "node_timeout_ms=200")).await;
    let lock_and_unlock = |name: &str| {
        let (backend, key) = (backend.clone(), key(name));
        async move {
            let request = request(&key, TTL);
            let granted = backend
                .try_acquire(&request)
                .await
                .is_ok_and(|t| t.is_some());
            if granted {
                let _ = backend.release(request.key(), request.lease_id()).await?;
            }
            Ok::<_, Failure>(granted)
        }
    };
    assert!(
        lock_and_unlock("before").await.unwrap(),
        "a slow link works"
    );

    // One reply slower than the node time-out: node 0's connection is given up on.
    proxies[0].set_mode(ProxyMode::Delay(Duration::from_millis(150)));
    lock_and_unlock("slow").await.unwrap();
    proxies[0].set_mode(link);
    proxies[3].set_mode(ProxyMode::BlackHole);
    proxies[4].set_mode(ProxyMode::BlackHole);
    eventually(Duration::from_secs(5), "node 0 answers again", || {
        lock_and_unlock("after")
    })
    .await
    .unwrap();
    cut(&proxies, 0);
}

/// Every node restarts without persistence (each forgets its entries and counters): the
/// next token is still above every token handed out before, since a missing counter starts
/// again from the node's clock, not from 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_after_every_node_restarts() {
    let mut servers = start_redis_nodes(REDLOCK_NODES).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let backend = support::connect(&redlock_url(&addrs, "")).await;
    let key = key("restarted");
    let mut before = FencingToken::new(0);
    for _ in 0..3 {
        let request = request(&key, TTL);
        before = backend
            .try_acquire(&request)
            .await
            .unwrap()
            .unwrap()
            .token();
        assert!(backend
            .release(request.key(), request.lease_id())
            .await
            .unwrap()
            .is_held());
    }
    for server in &mut servers {
        server.restart().await.unwrap();
    }
    let request = request(&key, TTL);
    let after = within(
        Duration::from_secs(10),
        "an acquire after the restarts",
        async {
            loop {
                match backend.try_acquire(&request).await {
                    Err(err) if err.kind() == ErrorKind::Unavailable => continue,
                    other => return other,
                }
            }
        },
    )
    .await
    .unwrap()
    .unwrap()
    .expect("the restarted nodes hold nothing")
    .token();
    assert!(
        after > before,
        "token {after} after the restarts is not above {before} from before them"
    );
    let _ = backend
        .release(request.key(), request.lease_id())
        .await
        .unwrap();
}

/// `list_held` shows a key only where a majority of nodes agree on its lease, as
/// `inspect` decides: a key held on three nodes is listed, a rival's entries on two nodes
/// are not; with two nodes cut off the majority key is still listed, and with three cut
/// off the listing is `Unavailable` (keys held on the unscanned majority could be missed),
/// never a short list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_only_keys_a_majority_holds() {
    let servers = start_redis_nodes(REDLOCK_NODES).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&addrs).await;
    let backend = through_proxies(&proxies).await;
    let base = key("list/");
    let held = request(&format!("{base}*held[x]"), Duration::from_secs(60));
    let token = backend.try_acquire(&held).await.unwrap().unwrap().token();
    let held_key = lock_key("distlock:", held.key().as_str());
    for server in &addrs[3..] {
        delete(*server, &held_key).await;
    }
    let minority = format!("{base}minority");
    for server in &addrs[..2] {
        hold_elsewhere(*server, &lock_key("distlock:", &minority)).await;
    }

    let listed = backend.list_held(&base, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (key, info) = &listed[0];
    assert_eq!(key, held.key());
    assert_eq!((info.lease_id, info.token), (held.lease_id(), token));

    cut(&proxies, 0b11000);
    let listed = backend.list_held(&base, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "two nodes cut: {listed:?}");
    // The three nodes that hold the key: the two left have no entry of it at all.
    cut(&proxies, 0b00111);
    let err = backend.list_held(&base, 10).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    cut(&proxies, 0);
}
