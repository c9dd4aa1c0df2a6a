//! Redis-specific faults: lost release notifications, a restart with `appendfsync always`,
//! a flushed script cache. Partitions, freezes and restarts in general are conformance
//! scenarios.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::{eventually, within, FaultyBackend, Op};
use lock_core::{AcquireOptions, Backoff, ErrorKind, LockClient, LockKey, Renewal, Wait};
use lock_redis::RedisConfig;
use support::{connect, redis_url, start_redis, start_redis_aof};

const SLACK: Duration = Duration::from_millis(300);

fn key(name: &str) -> String {
    format!("faults-{:08x}/{name}", fastrand::u32(..))
}

fn options(ttl: Duration) -> AcquireOptions {
    AcquireOptions {
        ttl,
        wait: Wait::UpTo(Duration::from_secs(5)),
        request_timeout: Duration::from_millis(200),
        ..AcquireOptions::default()
    }
}

/// With the release notification channel silently partitioned, a waiter still gets the
/// key through its fallback poll; with it healed, the wake-up is prompt again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_wakes_when_release_notifications_are_dropped() {
    let server = start_redis().await;
    let proxy = TcpFaultProxy::start(server.addr()).await.unwrap();
    let mut config = RedisConfig::from_url(&redis_url(server.addr(), "")).unwrap();
    config.subscriber_url = Some(redis_url(proxy.addr(), ""));
    let faulty = FaultyBackend::new(lock_redis::connect_with(&config).await.unwrap());
    let waiter = LockClient::new(faulty.clone());
    let holder = LockClient::new(connect(&redis_url(server.addr(), "")).await);
    let poll = Duration::from_millis(700);
    let waiting = AcquireOptions {
        backoff: Backoff {
            initial: poll,
            max: poll,
        },
        ..options(Duration::from_secs(10))
    };

    for (mode, bound) in [
        (ProxyMode::Pass, Duration::from_millis(150)),
        (ProxyMode::BlackHole, poll + SLACK),
    ] {
        let key = key("dropped");
        let guard = holder
            .lock(&key)
            .options(options(Duration::from_secs(10)))
            .await
            .unwrap();
        let before = faulty.completed(Op::Acquire);
        let task = tokio::spawn({
            let (waiter, key, waiting) = (waiter.clone(), key.clone(), waiting.clone());
            async move {
                waiter
                    .lock(&key)
                    .options(waiting)
                    .await
                    .map(|g| (g, Instant::now()))
            }
        });
        // Subscribed (before its first attempt) and found the key held: now cut, or not.
        eventually(
            Duration::from_secs(5),
            "the waiter's first attempt",
            || async { Ok(faulty.completed(Op::Acquire) > before) },
        )
        .await
        .unwrap();
        proxy.set_mode(mode);
        let released_at = Instant::now();
        guard.release().await.unwrap();
        let (got, got_at) = within(poll * 3, "waiter", task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let latency = got_at - released_at;
        assert!(
            latency <= bound,
            "{mode:?}: the waiter took {latency:?} (bound {bound:?})"
        );
        got.release().await.unwrap();
        proxy.set_mode(ProxyMode::Pass);
    }
}

/// With `appendfsync always` (and `durable=true` declared), a restart keeps the lock, its
/// remaining TTL and the counter: tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_aof_always_keeps_locks_and_counters() {
    let mut server = start_redis_aof().await;
    let url = redis_url(server.addr(), "durable=true");
    let backend = connect(&url).await;
    let client = LockClient::new(backend.clone()).with_defaults(AcquireOptions {
        renewal: Renewal::Manual,
        ..options(Duration::from_secs(30))
    });
    assert!(client.capabilities().durable_fencing);
    let key = key("durable");
    for _ in 0..3 {
        client.lock(&key).await.unwrap().release().await.unwrap();
    }
    let guard = client.lock(&key).await.unwrap();
    let lock_key = LockKey::new(&key).unwrap();
    let before = guard.token();

    server.restart().await.unwrap();
    let held = within(Duration::from_secs(5), "inspect after restart", async {
        loop {
            match backend.inspect(&lock_key).await {
                Err(err) if err.kind() == ErrorKind::Unavailable => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap()
    .unwrap()
    .expect("the lock survived the restart");
    assert_eq!(held.lease_id, guard.lease().id());
    assert_eq!(held.token, guard.token());
    // The counter itself came back: a token drawn now could come from the clock alone.
    let counter: u64 = redis::cmd("GET")
        .arg(format!("{}:fence", support::lock_key("distlock:", &key)))
        .query_async(&mut support::raw(server.addr()).await)
        .await
        .unwrap();
    assert_eq!(counter, before.get(), "the counter survived the restart");
    guard.renew().await.unwrap();
    guard.release().await.unwrap();
    let next = client.lock(&key).await.unwrap();
    assert!(next.token() > before, "tokens keep increasing");
    next.release().await.unwrap();
}

/// The scripts are called by hash; after `SCRIPT FLUSH` empties the server's script cache,
/// every operation still works because a missing script is loaded again transparently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let server = start_redis().await;
    let url = redis_url(server.addr(), "");
    let client =
        LockClient::new(connect(&url).await).with_defaults(options(Duration::from_secs(10)));
    let key = key("script-flush");
    let first = client.lock(&key).await.unwrap();
    let first_token = first.token();
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let flushed: String = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(flushed, "OK");
    first.renew().await.unwrap();
    first.release().await.unwrap();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<String>(&mut raw)
        .await
        .unwrap();
    let second = client.lock(&key).await.unwrap();
    assert!(second.token() > first_token);
    assert!(client.inspect(&key).await.unwrap().is_some());
    second.release().await.unwrap();
}
