//! Automatic renewal of many locks held by one client costs each server O(1) script calls
//! per renewal interval, not one per lock: the core's renewal engine hands every due lease
//! to `renew_many` at once, and both backends answer it with one script call per node.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::eventually;
use lock_core::{AcquireOptions, LockClient, Renewal};
use support::{redis_url, redlock_url, start_redis, start_redis_nodes};

const HELD: usize = 300;
/// Renewed every third of it: about every 300 ms.
const TTL: Duration = Duration::from_millis(900);
/// Renewal intervals watched.
const ROUNDS: u32 = 4;
/// Script calls one server may receive per renewal interval. Leases acquired one after
/// another start out of step, so the first rounds may take a few batches; one call per
/// lease would be `HELD`.
const CALLS_PER_INTERVAL: u64 = 6;

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

/// Holds `HELD` automatically renewed locks through `url` for `ROUNDS` renewal intervals,
/// and checks how many script calls each of `servers` received meanwhile.
async fn renewals_are_batched(url: &str, servers: &[SocketAddr]) {
    let client = LockClient::from_dyn(support::connect(url).await).with_defaults(AcquireOptions {
        ttl: TTL,
        renewal: Renewal::Auto,
        ..AcquireOptions::default()
    });
    let prefix = format!("batch-{:08x}/", fastrand::u32(..));
    let mut guards = Vec::with_capacity(HELD);
    for index in 0..HELD {
        guards.push(client.try_lock(format!("{prefix}{index}")).await.unwrap());
    }
    let mut before = Vec::new();
    for server in servers {
        before.push(evalsha_calls(*server).await);
    }
    let started = Instant::now();
    for round in 0..ROUNDS {
        // Every lease proven alive by a renewal sent after this round began.
        let mark = Instant::now();
        eventually(TTL, &format!("round {round}: every lease renewed"), || {
            let renewed = guards.iter().all(|guard| guard.lease().sent_at() > mark);
            async move { Ok(renewed) }
        })
        .await
        .unwrap();
    }
    let intervals = started.elapsed().as_secs_f64() / (TTL / 3).as_secs_f64();
    let bound = (intervals.ceil() as u64 + 1) * CALLS_PER_INTERVAL;
    for (server, before) in servers.iter().zip(before) {
        let calls = evalsha_calls(*server).await - before;
        eprintln!(
            "{HELD} leases over {intervals:.1} renewal intervals: {calls} script calls on {server}"
        );
        assert!(
            calls <= bound,
            "{HELD} leases took {calls} script calls on {server} in {intervals:.1} intervals"
        );
    }
    assert!(guards.iter().all(|guard| guard.is_held()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_renewals_are_batched() {
    let server = start_redis().await;
    renewals_are_batched(&redis_url(server.addr(), ""), &[server.addr()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_renewals_are_batched_on_every_node() {
    let nodes = start_redis_nodes(3).await;
    let addrs: Vec<SocketAddr> = nodes.iter().map(|node| node.addr()).collect();
    renewals_are_batched(&redlock_url(&addrs, ""), &addrs).await;
}
