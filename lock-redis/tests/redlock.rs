//! Redlock over five private servers behind fault proxies: every subset of nodes cut off,
//! a node frozen mid-acquire, and fencing tokens across majorities that differ.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use lock_core::{
    default_drift_allowance, AcquireRequest, DynBackend, ErrorKind, FencingToken, LockKey,
};
use support::{proxies, redlock_url, start_redis_nodes, REDLOCK_NODES};

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
                .unwrap());
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
                if let Some(token) = backend.try_acquire(&request).await.unwrap() {
                    tokens.push(token);
                    assert!(backend
                        .renew(request.key(), request.lease_id(), TTL)
                        .await
                        .unwrap());
                    assert!(backend
                        .release(request.key(), request.lease_id())
                        .await
                        .unwrap());
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
                Some(token) => break token,
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
                .unwrap());
        }
    }
    cut(&proxies, 0);
}
