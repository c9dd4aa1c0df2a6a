//! A three-member cluster under faults: the leader killed with a lock held, and one member
//! cut off from its clients.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use lock_core::{ErrorKind, LockClient};
use support::{connect, etcd_url, leader, start_cluster};

const TTL: Duration = Duration::from_secs(2);

async fn client(url: &str) -> LockClient {
    LockClient::from_dyn(connect(url).await)
}

/// With a lock held, the leader is killed: the holder keeps its lock or sees `lost()`
/// before anyone else is granted it, and tokens keep increasing under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_with_a_lock_held() {
    let mut members = start_cluster().await;
    let addrs: Vec<SocketAddr> = members.iter().map(|m| m.addr()).collect();
    let url = etcd_url(&addrs, "");
    let holder = client(&url).await;
    let rival = client(&url).await;
    let guard = holder.lock("leader").ttl(TTL).await.unwrap();
    let first = guard.token();
    let waiting = tokio::spawn(async move {
        let taken = rival
            .lock("leader")
            .ttl(TTL)
            .wait_up_to(Duration::from_secs(30))
            .await;
        (taken, Instant::now(), rival)
    });
    members[leader(&addrs).await.unwrap()].kill().unwrap();
    // Watch the holder for a few TTLs: it keeps the lock or learns it lost it.
    let lost = tokio::time::timeout(TTL * 3, guard.lost()).await.is_ok();
    let released_at = Instant::now();
    if lost {
        assert!(!guard.is_held());
    } else {
        assert!(guard.is_held(), "neither held nor lost");
        assert!(
            !waiting.is_finished(),
            "the rival got a key that is still held"
        );
    }
    let deadline = guard.lease().valid_until();
    match guard.release().await {
        Ok(()) => assert!(!lost, "a lost lock was released as held"),
        Err(err) => assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}"),
    }
    let (taken, taken_at, rival) = waiting.await.unwrap();
    let taken = taken.expect("the rival never got the key under the new leader");
    if lost {
        assert!(
            deadline <= taken_at,
            "the rival got the key before the holder's deadline"
        );
    } else {
        assert!(
            taken_at >= released_at,
            "the rival got the key before its release"
        );
    }
    assert!(taken.token() > first);
    taken.release().await.unwrap();
    let again = rival.lock("leader").ttl(TTL).await.unwrap();
    assert!(again.token() > first);
    again.release().await.unwrap();
}

/// One member is cut off from its clients: clients of the other members keep locking,
/// the cut-off client is `Unavailable`, and works again once the link is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_its_clients_leaves_the_others_serving() {
    let members = start_cluster().await;
    let mut proxies = Vec::new();
    for member in &members {
        proxies.push(TcpFaultProxy::start(member.addr()).await.unwrap());
    }
    let cut = client(&etcd_url(&[proxies[0].addr()], "request_timeout_ms=1000")).await;
    let others: Vec<SocketAddr> = proxies[1..].iter().map(TcpFaultProxy::addr).collect();
    let serving = client(&etcd_url(&others, "")).await;
    proxies[0].set_mode(ProxyMode::BlackHole);
    let mut last = None;
    for _ in 0..5 {
        let guard = serving.lock("served").ttl(TTL).await.unwrap();
        assert!(last.is_none_or(|token| guard.token() > token));
        last = Some(guard.token());
        guard.release().await.unwrap();
    }
    let refused = cut.lock("served").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::Unavailable);
    proxies[0].set_mode(ProxyMode::Pass);
    let guard = cut
        .lock("served")
        .ttl(TTL)
        .wait_up_to(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(last.is_some_and(|token| guard.token() > token));
    guard.release().await.unwrap();
}
