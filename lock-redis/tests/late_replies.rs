//! Replies delayed on the wire past the TTL, through TCP proxies in front of private Redis
//! servers: a grant that arrives after its deadline is never handed out.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use conformance_tests::network::grant_delayed_past_ttl_is_never_handed_out;
use conformance_tests::proxy::TcpFaultProxy;
use lock_core::{AcquireOptions, LockClient};
use support::{connect, proxies, redis_url, redlock_url, start_redis_nodes};

const TTL: Duration = Duration::from_millis(200);
const DELAY: Duration = Duration::from_millis(150);

fn client(backend: lock_core::backend::DynBackend) -> LockClient {
    LockClient::from_dyn(backend).with_defaults(AcquireOptions {
        request_timeout: Duration::from_secs(2),
        ..AcquireOptions::default()
    })
}

async fn late_replies(delayed: LockClient, direct: LockClient, proxies: &[TcpFaultProxy]) {
    let key = format!("late-replies/{:x}", fastrand::u64(..));
    let proxies: Vec<&TcpFaultProxy> = proxies.iter().collect();
    grant_delayed_past_ttl_is_never_handed_out(&delayed, &direct, &proxies, &key, TTL, DELAY)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_late_grant_is_never_handed_out() {
    let servers = start_redis_nodes(1).await;
    let proxies = proxies(&[servers[0].addr()]).await;
    let delayed = client(connect(&redis_url(proxies[0].addr(), "")).await);
    let direct = client(connect(&redis_url(servers[0].addr(), "")).await);
    late_replies(delayed, direct, &proxies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_late_grant_is_never_handed_out() {
    let servers = start_redis_nodes(3).await;
    let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
    let proxies = proxies(&addrs).await;
    let proxied: Vec<_> = proxies.iter().map(|p| p.addr()).collect();
    // Node replies slower than the TTL but within the node time-out: the quorum answers,
    // too late.
    let options = "node_timeout_ms=2000&response_timeout_ms=2000";
    let delayed = client(connect(&redlock_url(&proxied, options)).await);
    let direct = client(connect(&redlock_url(&addrs, "")).await);
    late_replies(delayed, direct, &proxies).await;
}
