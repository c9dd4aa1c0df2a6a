//! Renewals of many locks held by one client travel together: a round of 300 concurrent
//! renewals reaches the server as a handful of script calls, not 300.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use lock_core::{AcquireOptions, LockClient, Renewal};
use support::{redis_url, start_redis};
use tokio::task::JoinSet;

const HELD: usize = 300;

async fn evalsha_calls(connection: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_renewals_are_batched() {
    let server = start_redis().await;
    let url = redis_url(server.addr(), "");
    let client = LockClient::from_dyn(support::connect(&url).await).with_defaults(AcquireOptions {
        ttl: Duration::from_secs(30),
        renewal: Renewal::Manual,
        ..AcquireOptions::default()
    });
    let prefix = format!("batch-{:08x}/", fastrand::u32(..));
    let mut guards = Vec::new();
    for index in 0..HELD {
        guards.push(std::sync::Arc::new(
            client.try_lock(format!("{prefix}{index}")).await.unwrap(),
        ));
    }
    let raw = redis::Client::open(format!("redis://{}/0", server.addr())).unwrap();
    let mut stats = raw.get_multiplexed_async_connection().await.unwrap();
    let before = evalsha_calls(&mut stats).await;

    let mut renewals = JoinSet::new();
    for guard in &guards {
        let guard = guard.clone();
        renewals.spawn(async move { guard.renew().await });
    }
    while let Some(done) = renewals.join_next().await {
        done.unwrap().unwrap();
    }
    let calls = evalsha_calls(&mut stats).await - before;
    eprintln!("{HELD} concurrent renewals reached the server as {calls} script calls");
    assert!(calls <= 20, "{HELD} renewals took {calls} script calls");

    for guard in guards {
        let guard = std::sync::Arc::try_unwrap(guard).ok().unwrap();
        assert!(guard.release().await.unwrap());
    }
}
