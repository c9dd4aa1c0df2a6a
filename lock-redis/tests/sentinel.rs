//! Redis behind Sentinel (`redis+sentinel://`): the primary is found through the
//! sentinels, followed across a failover, and a replica is never written to.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::store_process::{StoreProcess, StoreSpec};
use conformance_tests::{eventually, within, Failure};
use lock_core::backend::{default_drift_allowance, AcquireRequest};
use lock_core::{AcquireOptions, ErrorKind, LockClient, LockKey, Renewal, Wait};
use support::{connect, entry, lock_key, raw, SentinelSetup, SENTINEL_MASTER};

/// How long a sentinel waits for a silent primary before calling it down.
const DOWN_AFTER: Duration = Duration::from_secs(1);
/// Bound on a failover, from asking for it (or killing the primary) to a client's first
/// lock on the new primary: Sentinel's own steps take a second or two here.
const FAILOVER_BOUND: Duration = Duration::from_secs(15);
/// Allowance for round trips and a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

fn key(name: &str) -> String {
    format!("sentinel-{:08x}/{name}", fastrand::u32(..))
}

fn options(ttl: Duration) -> AcquireOptions {
    AcquireOptions {
        ttl,
        renewal: Renewal::Auto,
        wait: Wait::No,
        request_timeout: Duration::from_secs(2),
        ..AcquireOptions::default()
    }
}

fn request(key: &str) -> AcquireRequest {
    let ttl = Duration::from_secs(30);
    AcquireRequest::new(
        LockKey::new(key).unwrap(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    )
}

/// A dead sentinel listed first does not stand in the way; the lock is taken on the
/// primary; credentials reach the primary and show nowhere; a name no sentinel monitors
/// is `Misconfigured`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_is_found_through_the_live_sentinels() {
    let setup = SentinelSetup::start(Duration::from_secs(30)).await;
    let primary = setup.primary().await;
    let dead = SocketAddr::from((
        [127, 0, 0, 1],
        conformance_tests::store_process::free_port().unwrap(),
    ));
    let mut hosts = vec![dead.to_string()];
    hosts.extend(setup.sentinels().iter().map(|s| s.addr().to_string()));
    let hosts = hosts.join(",");
    let url = format!("redis+sentinel://distlock-test:right-pass@{hosts}/{SENTINEL_MASTER}/0");
    let backend = connect(&url).await;
    let shown = format!("{backend:?}");
    assert!(!shown.contains("right-pass"), "{shown}");
    assert!(shown.contains(SENTINEL_MASTER), "{shown}");
    let client = LockClient::new(backend).with_defaults(options(Duration::from_secs(10)));
    let key = key("found");
    let guard = client.lock(&key).await.unwrap();
    let stored = entry(primary, &lock_key("distlock:", &key)).await.unwrap();
    assert!(
        stored.starts_with(&guard.lease().id().to_string()),
        "{stored}"
    );
    guard.release().await.unwrap();

    let err = lock_redis::connect(&format!("redis+sentinel://{hosts}/no-such-master"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
    assert!(err.message().contains("no-such-master"), "{err}");
}

/// After `SENTINEL FAILOVER`, a client takes locks on the new primary within the bound;
/// the lock held across the failover (on both replicas, each grant confirmed by one,
/// `replicas=1`) keeps one holder: the holder either keeps its lease, renewed on the new
/// primary, or has seen `lost()` before a rival gets the key; tokens keep increasing.
///
/// A grant made during the failover can still land on the old primary: Sentinel names the
/// promoted replica while it reconfigures the other one, and until the old primary is
/// turned into a replica (up to ten seconds later) a client that has not heard of the
/// switch yet writes there, confirmed by the replica that was not promoted; the grant is
/// gone once the old primary resyncs (docs.md, *Sentinel*). So the first locks after the
/// switch are taken until one is on the new primary, and the bound is on that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_a_failover_and_a_held_lock_keeps_one_holder() {
    let setup = SentinelSetup::start(DOWN_AFTER).await;
    let url = setup.url("replicas=1&replica_timeout_ms=100");
    let ttl = Duration::from_secs(3);
    let holder = LockClient::new(connect(&url).await).with_defaults(options(ttl));
    let rival = LockClient::new(connect(&url).await).with_defaults(options(ttl));
    let held = key("held");
    let guard = holder.lock(&held).await.unwrap();
    let stored = lock_key("distlock:", &held);
    let replicas: Vec<SocketAddr> = setup.servers[1..3].iter().map(StoreProcess::addr).collect();
    // Whichever replica Sentinel promotes has the grant.
    eventually(SLACK, "both replicas have the grant", || async {
        for replica in &replicas {
            if entry(*replica, &stored).await.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
    .unwrap();

    let old = setup.primary().await;
    let started = Instant::now();
    failover(&setup).await;
    eventually(
        FAILOVER_BOUND,
        "the sentinels name a new primary",
        || async { Ok(setup.primary().await != old) },
    )
    .await
    .unwrap();
    let new = setup.primary().await;
    let remaining = FAILOVER_BOUND.saturating_sub(started.elapsed());
    eventually(remaining, "a lock on the new primary", || async {
        let after = rival
            .lock(key("after"))
            .wait_up_to(remaining)
            .await
            .map_err(|err| Failure(err.to_string()))?;
        let on_new = entry(new, &lock_key("distlock:", after.key().as_str()))
            .await
            .is_some();
        // A grant on the old primary may already be gone: its release may find nothing.
        let _ = after.release().await;
        Ok(on_new)
    })
    .await
    .unwrap();
    eprintln!(
        "a lock on the new primary {:?} after SENTINEL FAILOVER",
        started.elapsed()
    );

    // The holder renews on the new primary; a rival is refused meanwhile, or the holder
    // has lost the lease before the rival is granted it.
    let switched = Instant::now();
    let renewed = eventually(
        ttl + SLACK,
        "the holder renews on the new primary",
        || async {
            match rival.lock(&held).no_wait().await {
                Ok(taken) => {
                    assert!(!guard.is_held(), "two holders across the failover");
                    taken.release().await.map_err(|e| Failure(e.to_string()))?;
                    Err(Failure("the holder lost its lease in the failover".into()))
                }
                Err(err) if err.kind() == ErrorKind::HeldByAnother => {
                    Ok(guard.lease().valid_until() > switched + ttl / 2)
                }
                Err(err) => Err(Failure(format!("the rival's attempt failed: {err}"))),
            }
        },
    )
    .await;
    match renewed {
        Ok(()) => {
            let token = guard.token();
            assert!(entry(new, &stored).await.is_some());
            guard.release().await.unwrap();
            let next = rival.lock(&held).await.unwrap();
            assert!(next.token() > token, "{} after {token}", next.token());
            next.release().await.unwrap();
        }
        // The permitted outcome: the loss was seen, and no rival held the key meanwhile.
        Err(failure) => {
            eprintln!("{failure:?}");
            within(SLACK, "the holder's loss", guard.lost())
                .await
                .unwrap();
        }
    }
}

/// A `+switch-master` announcement alone moves a client: here the old primary refuses to
/// be turned into a replica (its default user may not run `REPLICAOF`), so it stays a
/// writable master that never answers `READONLY` nor breaks the connection, and only the
/// announcement tells the client to look for the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_announced_by_sentinel_moves_the_client() {
    let setup = SentinelSetup::start(DOWN_AFTER).await;
    let client = LockClient::new(connect(&setup.url("")).await)
        .with_defaults(options(Duration::from_secs(3)));
    let old = setup.primary().await;
    client
        .lock(key("before"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "-replicaof", "-slaveof"][..])
        .query_async(&mut raw(old).await)
        .await
        .unwrap();
    failover(&setup).await;
    eventually(
        FAILOVER_BOUND,
        "every sentinel names a new primary",
        || async {
            for sentinel in setup.sentinels() {
                let (host, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(SENTINEL_MASTER)
                    .query_async(&mut raw(sentinel.addr()).await)
                    .await
                    .unwrap();
                if SocketAddr::new(host.parse().unwrap(), port) == old {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
    .unwrap();
    let new = setup.primary().await;
    eventually(SLACK, "a lock on the new primary", || async {
        let guard = client
            .lock(key("after"))
            .await
            .map_err(|err| Failure(err.to_string()))?;
        let on_new = entry(new, &lock_key("distlock:", guard.key().as_str()))
            .await
            .is_some();
        guard
            .release()
            .await
            .map_err(|err| Failure(err.to_string()))?;
        Ok(on_new)
    })
    .await
    .unwrap();
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut raw(old).await)
        .await
        .unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec())),
        "the old primary was demoted after all"
    );
}

/// Killing the primary: the sentinels agree it is down, promote a replica, and a client
/// that was connected to the dead primary locks on the new one within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_the_promotion_after_the_primary_dies() {
    let mut setup = SentinelSetup::start(DOWN_AFTER).await;
    let client = LockClient::new(connect(&setup.url("")).await)
        .with_defaults(options(Duration::from_secs(3)));
    client
        .lock(key("before"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let old = setup.primary().await;
    let started = Instant::now();
    setup.data_servers()[0].kill().unwrap();
    let guard = within(
        FAILOVER_BOUND,
        "a lock after the primary died",
        client.lock(key("after")).wait_up_to(FAILOVER_BOUND),
    )
    .await
    .unwrap()
    .unwrap();
    let took = started.elapsed();
    // The sentinel asked may hear of the promotion from its peers a little later.
    eventually(SLACK, "the sentinels name a new primary", || async {
        Ok(setup.primary().await != old)
    })
    .await
    .unwrap();
    let new = setup.primary().await;
    assert!(entry(new, &lock_key("distlock:", guard.key().as_str()))
        .await
        .is_some());
    guard.release().await.unwrap();
    eprintln!("a lock on the new primary {took:?} after the primary was killed");
}

/// A server Sentinel names as primary that is a replica is refused (`ROLE`), so nothing is
/// written to it; a primary demoted under a live connection answers `READONLY`, which is
/// `Unavailable` and drops the connection, so the next attempt asks the sentinels again;
/// once the server is a primary again, locking works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_never_written_and_a_demoted_primary_is_left() {
    let primary = support::start_redis().await;
    let replica = StoreProcess::start(StoreSpec::redis_replica_of(primary.port()))
        .await
        .unwrap();
    // One sentinel (below its quorum of 2, so it never fails over) naming the replica.
    let sentinel = StoreProcess::start(StoreSpec::redis_sentinel(
        replica.port(),
        SENTINEL_MASTER,
        Duration::from_secs(30),
    ))
    .await
    .unwrap();
    let url = format!(
        "redis+sentinel://{}/{SENTINEL_MASTER}?connect_timeout_ms=500",
        sentinel.addr()
    );
    let err = lock_redis::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("ROLE"), "{err}");

    replica_of(replica.addr(), None).await;
    let backend = connect(&url).await;
    assert!(backend
        .try_acquire(&request(&key("promoted")))
        .await
        .unwrap()
        .is_some());

    replica_of(replica.addr(), Some(primary.addr())).await;
    let demoted = key("demoted");
    let err = backend.try_acquire(&request(&demoted)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(format!("{err:?}").contains("read only replica"), "{err:?}");
    // The connection was dropped: the next attempt checks the server's role again.
    let err = backend.try_acquire(&request(&demoted)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.message().contains("ROLE"), "{err}");

    replica_of(replica.addr(), None).await;
    assert!(backend
        .try_acquire(&request(&demoted))
        .await
        .unwrap()
        .is_some());
    assert!(entry(replica.addr(), &lock_key("distlock:", &demoted))
        .await
        .is_some());
}

/// Asks the first sentinel to fail the primary over (`SENTINEL FAILOVER`).
async fn failover(setup: &SentinelSetup) {
    let () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SENTINEL_MASTER)
        .query_async(&mut raw(setup.sentinels()[0].addr()).await)
        .await
        .unwrap();
}

/// `REPLICAOF` on the server at `server`: of `primary`, or `NO ONE` to promote it.
async fn replica_of(server: SocketAddr, primary: Option<SocketAddr>) {
    let mut cmd = redis::cmd("REPLICAOF");
    match primary {
        Some(primary) => cmd.arg(primary.ip().to_string()).arg(primary.port()),
        None => cmd.arg("NO").arg("ONE"),
    };
    let () = cmd.query_async(&mut raw(server).await).await.unwrap();
}
