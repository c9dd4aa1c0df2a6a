//! Renewals of many locks held by one client travel together: a round of 300 concurrent
//! renewals reaches each server as a handful of script calls, not 300, on a single node
//! and on every node of a Redlock.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{AcquireOptions, LockClient, Renewal};
use support::{redis_url, redlock_url, start_redis, start_redis_nodes};
use tokio::task::JoinSet;

const HELD: usize = 300;

async fn evalsha_calls(server: SocketAddr) -> u64 {
    let raw = redis::Client::open(format!("redis://{server}/0")).unwrap();
    let mut connection = raw.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// Holds `HELD` locks through `url`, renews them all at once, and checks how many script
/// calls each of `servers` received for it.
async fn renewals_are_batched(url: &str, servers: &[SocketAddr]) {
    let client = LockClient::from_dyn(support::connect(url).await).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(30),
        renewal: Renewal::Manual,
        ..AcquireOptions::default()
    });
    let prefix = format!("batch-{:08x}/", fastrand::u32(..));
    let mut guards = Vec::new();
    for index in 0..HELD {
        guards.push(Arc::new(
            client.try_lock(format!("{prefix}{index}")).await.unwrap(),
        ));
    }
    let mut before = Vec::new();
    for server in servers {
        before.push(evalsha_calls(*server).await);
    }
    let mut renewals = JoinSet::new();
    for guard in &guards {
        let guard = guard.clone();
        renewals.spawn(async move { guard.renew().await });
    }
    while let Some(done) = renewals.join_next().await {
        done.unwrap().unwrap();
    }
    for (server, before) in servers.iter().zip(before) {
        let calls = evalsha_calls(*server).await - before;
        eprintln!("{HELD} concurrent renewals reached {server} as {calls} script calls");
        assert!(
            calls <= 20,
            "{HELD} renewals took {calls} script calls on {server}"
        );
    }
    for guard in guards {
        let guard = Arc::try_unwrap(guard).ok().unwrap();
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_renewals_are_batched() {
    let server = start_redis().await;
    renewals_are_batched(&redis_url(server.addr(), ""), &[server.addr()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_renewals_are_batched_on_every_node() {
    let nodes = start_redis_nodes(3).await;
    let addrs: Vec<SocketAddr> = nodes.iter().map(|node| node.addr()).collect();
    renewals_are_batched(&redlock_url(&addrs, ""), &addrs).await;
}
