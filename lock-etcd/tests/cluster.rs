//! A three-member cluster under faults: the leader killed with a lock held, and one member
//! cut off from its clients.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use lock_core::{ErrorKind, LockClient};
use support::{connect, etcd_url, leader, start_cluster, start_cluster_with_peer_proxies};

const TTL: Duration = Duration::from_secs(2);

async fn client(url: &str) -> LockClient {
    LockClient::new(connect(url).await)
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

/// A member is cut off from its peers (its raft links black-holed) while a holder talks
/// only to it and a rival talks to the other two: the rival is granted the key only after
/// the holder's deadline (so after its `lost()`), or the holder keeps the key, as the
/// majority sees it, while the rival waits. Once healed, the key passes to the rival with
/// a greater token.
async fn holder_on_a_member_cut_from_its_peers(cut_the_leader: bool) {
    let (members, proxies) = start_cluster_with_peer_proxies().await;
    let addrs: Vec<SocketAddr> = members.iter().map(|m| m.addr()).collect();
    let lead = leader(&addrs).await.unwrap();
    let cut = if cut_the_leader {
        lead
    } else {
        (lead + 1) % addrs.len()
    };
    let others: Vec<SocketAddr> = (0..addrs.len())
        .filter(|i| *i != cut)
        .map(|i| addrs[i])
        .collect();
    let holder = client(&etcd_url(&[addrs[cut]], "request_timeout_ms=1000")).await;
    let rival = client(&etcd_url(&others, "")).await;
    let observer = client(&etcd_url(&others, "")).await;
    let guard = holder.lock("cut-member").ttl(TTL).await.unwrap();
    let first = guard.token();
    let mut waiting = tokio::spawn(async move {
        let taken = rival
            .lock("cut-member")
            .ttl(TTL)
            .wait_up_to(Duration::from_secs(60))
            .await;
        (taken, Instant::now())
    });
    proxies[cut].set_mode(ProxyMode::BlackHole);
    if cut_the_leader {
        // The cut is real: the others stop hearing the leader and elect one of their own.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !leader(&others)
            .await
            .is_ok_and(|new| others[new] != addrs[cut])
        {
            assert!(
                Instant::now() < deadline,
                "the others never elected a new leader"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    match tokio::time::timeout(TTL * 4, &mut waiting).await {
        Ok(done) => {
            let (taken, taken_at) = done.unwrap();
            let taken = taken.expect("the rival's wait failed");
            assert!(
                guard.lease().valid_until() <= taken_at,
                "the rival got the key {:?} before the holder's deadline",
                guard.lease().valid_until() - taken_at
            );
            assert!(!guard.is_held());
            assert!(taken.token() > first);
            eprintln!("cut member {cut} (leader: {cut_the_leader}): the holder lost, then the rival was granted");
            proxies[cut].set_mode(ProxyMode::Pass);
            assert_eq!(guard.release().await.unwrap_err().kind(), ErrorKind::Lost);
            taken.release().await.unwrap();
        }
        Err(_) => {
            // The rival still waits: the majority must still see the holder as owner.
            let status = observer.inspect("cut-member").await.unwrap();
            assert_eq!(status.map(|s| s.token), Some(first), "who owns the key?");
            eprintln!("cut member {cut} (leader: {cut_the_leader}): the holder kept the key, the rival waited");
            proxies[cut].set_mode(ProxyMode::Pass);
            match guard.release().await {
                Ok(()) => {}
                Err(err) => assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}"),
            }
            let (taken, _) = waiting.await.unwrap();
            let taken = taken.expect("the rival never got the key after the heal");
            assert!(taken.token() > first);
            taken.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_on_a_follower_cut_from_its_peers_is_never_overtaken() {
    holder_on_a_member_cut_from_its_peers(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_on_the_leader_cut_from_its_peers_is_never_overtaken() {
    holder_on_a_member_cut_from_its_peers(true).await;
}
