//! Faults inside a ZooKeeper ensemble: a follower cut off from its leader while its
//! clients still reach it.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use conformance_tests::harness::{granted_within, spawn_lock};
use conformance_tests::proxy::ProxyMode;
use conformance_tests::store_process::ZOOKEEPER_TICK_MS;
use conformance_tests::SLACK;
use lock_core::{AcquireOptions, Backoff, LockClient, Renewal, Wait};

use support::{connect, zk_url, ProxiedEnsemble};

/// The test ensemble's `syncLimit × tickTime`: how long a follower cut off from its
/// leader keeps serving its clients.
const FOLLOWER_GIVES_UP: Duration = Duration::from_millis(20 * ZOOKEEPER_TICK_MS);

/// A holder connected to a follower that is cut off from the leader: the follower keeps
/// answering reads until it gives up on the leader, but the leader counts the holder's
/// session down from the follower's last report, and expires it and grants the key to a
/// rival on the leader. The holder's `lost()` must come no later than that grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_from_its_leader_loses_the_lock_before_the_rival_gets_it() {
    let ensemble = ProxiedEnsemble::start().await;
    let leader = ensemble.member_in("leader").await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let holder = LockClient::new(connect(&zk_url(&[ensemble.servers[follower].addr()], "")).await);
    let rival = LockClient::new(connect(&zk_url(&[ensemble.servers[leader].addr()], "")).await);
    let key = format!("ensemble-{:016x}/follower-cut", fastrand::u64(..));
    let ttl = Duration::from_millis(1000);
    let guard = holder.lock(&key).ttl(ttl).await.unwrap();
    // Lands the cut anywhere in the keep-alive cycle.
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..400))).await;
    ensemble.link(follower, leader, ProxyMode::BlackHole);
    let cut_at = Instant::now();
    let options = AcquireOptions {
        wait: Wait::UpTo(FOLLOWER_GIVES_UP + ttl * 10),
        backoff: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(10),
        },
        ..AcquireOptions::default()
    };
    let waiting = spawn_lock(rival.clone(), &key, options);
    tokio::time::timeout(FOLLOWER_GIVES_UP + ttl + SLACK, guard.lost())
        .await
        .expect("lost() after the follower was cut off");
    let (taken, got_at) = granted_within(FOLLOWER_GIVES_UP + ttl * 8, "rival", waiting)
        .await
        .unwrap();
    let valid_until = guard.lease().valid_until();
    assert!(
        valid_until <= got_at,
        "the rival got the key {:?} before the holder's deadline (cut at +0, grant at {:?})",
        valid_until - got_at,
        got_at - cut_at
    );
    assert!(taken.token() > guard.token());
    taken.release().await.unwrap();
}

/// The same cut under a lease renewed by hand: `renew()` through the cut-off follower must
/// not move the deadline past the leader's expiry of the session (a plain read would be
/// answered by the follower until it gives up on the leader). Both the renewal's own sync
/// and the session keep-alive's guard this: the follower answers a session's requests in
/// order, so a read queued behind an unanswered keep-alive sync goes unanswered too (the
/// test fails only when both are plain reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_renewal_through_a_follower_cut_from_its_leader_does_not_outlive_the_session() {
    let ensemble = ProxiedEnsemble::start().await;
    let leader = ensemble.member_in("leader").await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let holder = LockClient::new(connect(&zk_url(&[ensemble.servers[follower].addr()], "")).await);
    let rival = LockClient::new(connect(&zk_url(&[ensemble.servers[leader].addr()], "")).await);
    let key = format!("ensemble-{:016x}/follower-cut-manual", fastrand::u64(..));
    let ttl = Duration::from_millis(1000);
    let guard = holder
        .lock(&key)
        .ttl(ttl)
        .renewal(Renewal::Manual)
        .await
        .unwrap();
    guard.renew().await.unwrap();
    ensemble.link(follower, leader, ProxyMode::BlackHole);
    let cut_at = Instant::now();
    let options = AcquireOptions {
        wait: Wait::UpTo(FOLLOWER_GIVES_UP + ttl * 10),
        backoff: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(10),
        },
        ..AcquireOptions::default()
    };
    let waiting = spawn_lock(rival.clone(), &key, options);
    // Renews as a careful holder would, until the lease is lost.
    let renewing = async {
        while guard.is_held() {
            let _ = guard.renew().await;
            tokio::time::sleep(ttl / 5).await;
        }
    };
    tokio::time::timeout(FOLLOWER_GIVES_UP + ttl + SLACK, renewing)
        .await
        .expect("the lease is lost after the follower was cut off");
    let (taken, got_at) = granted_within(FOLLOWER_GIVES_UP + ttl * 8, "rival", waiting)
        .await
        .unwrap();
    let valid_until = guard.lease().valid_until();
    assert!(
        valid_until <= got_at,
        "the rival got the key {:?} before the holder's deadline (grant at +{:?})",
        valid_until - got_at,
        got_at - cut_at
    );
    assert!(taken.token() > guard.token());
    taken.release().await.unwrap();
}
