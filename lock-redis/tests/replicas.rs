//! Grants confirmed by replicas (`replicas=N`): against a private primary with one
//! replica, a grant, renewal or record the replica does not confirm in time never counts.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use conformance_tests::store_process::{StoreProcess, StoreSpec};
use conformance_tests::within;
use lock_core::backend::{default_drift_allowance, AcquireRequest, Record};
use lock_core::{
    AcquireOptions, ErrorKind, HoldKind, LeaseHealth, LeaseId, LockClient, LockKey, Renewal, Wait,
};
use support::{connect, entry, lock_key, redis_url, start_redis};

/// How long the tests let a replica take to confirm.
const REPLICA_TIMEOUT: Duration = Duration::from_millis(100);
/// Allowance on top of the replica time-out for the round trips and a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

fn key(name: &str) -> String {
    format!("replicas-{:08x}/{name}", fastrand::u32(..))
}

/// A primary and one replica whose link is up (the replica's readiness probe waits for it).
async fn primary_and_replica() -> (StoreProcess, StoreProcess) {
    let primary = start_redis().await;
    let replica = StoreProcess::start(StoreSpec::redis_replica_of(primary.port()))
        .await
        .unwrap_or_else(|err| panic!("cannot start the replica: {err}"));
    (primary, replica)
}

fn confirmed_url(primary: &StoreProcess, replicas: &str) -> String {
    redis_url(
        primary.addr(),
        &format!(
            "replicas={replicas}&replica_timeout_ms={}",
            REPLICA_TIMEOUT.as_millis()
        ),
    )
}

fn request(key: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        LockKey::new(key).unwrap(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    )
}

fn options(ttl: Duration, renewal: Renewal) -> AcquireOptions {
    AcquireOptions {
        ttl,
        renewal,
        wait: Wait::No,
        request_timeout: Duration::from_secs(2),
        ..AcquireOptions::default()
    }
}

/// (a) With the replica in step, lock, renew and release work, and the replica already
/// has the grant when the guard is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_grants_are_on_the_replica_when_handed_out() {
    let (primary, replica) = primary_and_replica().await;
    let client = LockClient::new(connect(&confirmed_url(&primary, "1")).await)
        .with_defaults(options(Duration::from_secs(10), Renewal::Manual));
    let key = key("confirmed");
    let guard = client.lock(&key).await.unwrap();
    let stored = lock_key("distlock:", &key);
    let on_replica = entry(replica.addr(), &stored).await;
    assert!(on_replica.is_some(), "the replica does not have the grant");
    assert_eq!(on_replica, entry(primary.addr(), &stored).await);
    assert!(on_replica
        .unwrap()
        .starts_with(&guard.lease().id().to_string()));
    guard.renew().await.unwrap();
    assert_eq!(guard.health(), LeaseHealth::Healthy);
    guard.release().await.unwrap();
    client.lock(&key).await.unwrap().release().await.unwrap();
}

/// (b) With the replica frozen, an acquisition fails as `Unavailable` within the replica
/// time-out (plus slack) and leaves the key free on the primary: the grant is rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_grant_is_rolled_back_and_fails_unavailable() {
    let (primary, replica) = primary_and_replica().await;
    let backend = connect(&confirmed_url(&primary, "1")).await;
    let key = key("frozen");
    replica.pause().unwrap();
    let started = Instant::now();
    let err = backend
        .try_acquire(&request(&key, Duration::from_secs(30)))
        .await
        .unwrap_err();
    let took = started.elapsed();
    replica.resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(took < REPLICA_TIMEOUT + SLACK, "took {took:?}");
    assert_eq!(
        entry(primary.addr(), &lock_key("distlock:", &key)).await,
        None,
        "the unconfirmed grant is still on the primary"
    );
    assert!(backend
        .inspect(&LockKey::new(&key).unwrap())
        .await
        .unwrap()
        .is_none());
    assert!(backend.stored_keys(&key).await.unwrap().is_empty());
}

/// (b) for shared holds: a permit and a write the frozen replica does not confirm fail as
/// `Unavailable` and are rolled back, so the semaphore and the reader-writer lock are
/// empty again; with the replica back, both are granted and are on the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_shared_grants_are_rolled_back() {
    let (primary, replica) = primary_and_replica().await;
    let backend = connect(&confirmed_url(&primary, "1")).await;
    let name = key("shared");
    let shared = [HoldKind::Permit { limit: 2 }, HoldKind::Write]
        .map(|kind| LockKey::new(&name).unwrap().held_as(kind).unwrap());
    replica.pause().unwrap();
    let mut refused = Vec::new();
    for key in &shared {
        let ttl = Duration::from_secs(30);
        let request = AcquireRequest::new(
            key.clone(),
            ttl,
            default_drift_allowance(ttl),
            Renewal::Manual,
        );
        refused.push(backend.try_acquire(&request).await);
    }
    replica.resume().unwrap();
    for (key, outcome) in shared.iter().zip(refused) {
        let err = outcome.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{key:?}: {err}");
        assert!(backend.holders(key).await.unwrap().is_empty(), "{key:?}");
    }
    assert!(backend.stored_keys(&name).await.unwrap().is_empty());

    let client = LockClient::new(backend.clone())
        .with_defaults(options(Duration::from_secs(10), Renewal::Manual));
    let permit = client.semaphore(&name, 2).await.unwrap();
    let writer = client.write_lock(&name).await.unwrap();
    let on_replica: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut support::raw(replica.addr()).await)
        .await
        .unwrap();
    for stored in [
        ":semaphore",
        ":semaphore:expiry",
        ":rwlock",
        ":rwlock:expiry",
    ] {
        assert!(
            on_replica.iter().any(|k| k.ends_with(stored)),
            "{stored} is not on the replica: {on_replica:?}"
        );
    }
    permit.release().await.unwrap();
    writer.release().await.unwrap();
}

/// (c) A renewal the frozen replica does not confirm fails and does not move the
/// guard's deadline; renewing in the background, the guard goes unhealthy and is lost by
/// its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_renewal_does_not_extend_the_lease() {
    let (primary, replica) = primary_and_replica().await;
    let backend = connect(&confirmed_url(&primary, "1")).await;
    let ttl = Duration::from_secs(2);
    let manual = LockClient::new(backend.clone()).with_defaults(options(ttl, Renewal::Manual));
    let automatic = LockClient::new(backend).with_defaults(options(ttl, Renewal::Auto));
    let manual_guard = manual.lock(key("manual")).await.unwrap();
    let auto_guard = automatic.lock(key("auto")).await.unwrap();
    let deadline = manual_guard.lease().valid_until();

    replica.pause().unwrap();
    let err = manual_guard.renew().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(manual_guard.lease().valid_until(), deadline);

    within(
        ttl + SLACK,
        "the background renewal's trouble",
        auto_guard.renewal_trouble(),
    )
    .await
    .unwrap();
    within(
        ttl + SLACK,
        "the loss of the unconfirmed lease",
        auto_guard.lost(),
    )
    .await
    .unwrap();
    replica.resume().unwrap();
}

/// A record the frozen replica does not confirm is not reported written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_record_write_fails_unavailable() {
    let (primary, replica) = primary_and_replica().await;
    let backend = connect(&confirmed_url(&primary, "1")).await;
    let key = key("record");
    let lease = LeaseId::random();
    let token = backend
        .try_acquire(&request(&key, Duration::from_secs(30)).with_lease_id(lease))
        .await
        .unwrap()
        .unwrap()
        .token();
    let record = Record {
        value: b"done".to_vec(),
        fingerprint: None,
        token,
    };
    let key = LockKey::new(&key).unwrap();
    let retention = Duration::from_secs(60);
    replica.pause().unwrap();
    let err = backend
        .write_record(&key, lease, &record, retention)
        .await
        .unwrap_err();
    replica.resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(backend
        .write_record(&key, lease, &record, retention)
        .await
        .unwrap()
        .is_held());
}

/// (d) `replicas=all` asks for every replica online at the time: a frozen one (still
/// online to the primary) fails the grant; a primary with no replica at all grants
/// without confirmation, as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_means_every_online_replica_and_none_when_there_are_none() {
    let (primary, replica) = primary_and_replica().await;
    let backend = connect(&confirmed_url(&primary, "all")).await;
    let key = key("all");
    let lock = request(&key, Duration::from_secs(30));
    replica.pause().unwrap();
    let err = backend.try_acquire(&lock).await.unwrap_err();
    replica.resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(backend.try_acquire(&lock).await.unwrap().is_some());

    let alone = start_redis().await;
    let backend = connect(&confirmed_url(&alone, "all")).await;
    assert!(backend.try_acquire(&lock).await.unwrap().is_some());
}

/// Detaches `replica` from its primary and makes it a primary of its own, as a failover
/// does to a replica cut off from the old primary (which keeps serving).
async fn promote(replica: &StoreProcess) {
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut support::raw(replica.addr()).await)
        .await
        .unwrap();
}

/// (f) What the docs warn of, shown: without replica confirmation, a replica promoted
/// while the old primary still serves (a partition, a failover of a live primary) does not
/// have a grant the old primary acknowledged after the split, so the key is granted again
/// on the new primary: two clients hold it at once. The fencing counter's last increment
/// is lost too, yet the new primary's token is above the old one's (drawn from its clock),
/// so a resource fenced by the token refuses the old holder once the new one wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_confirmation_a_promotion_can_give_the_key_to_two_holders() {
    let (primary, replica) = primary_and_replica().await;
    let key = key("split");
    let long = options(Duration::from_secs(30), Renewal::Manual);
    // Tokens drawn before the split are on both servers.
    let old =
        LockClient::new(connect(&redis_url(primary.addr(), "")).await).with_defaults(long.clone());
    old.lock(&key).await.unwrap().release().await.unwrap();
    let synced: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(SLACK.as_millis() as u64)
        .query_async(&mut support::raw(primary.addr()).await)
        .await
        .unwrap();
    assert_eq!(synced, 1, "the replica did not catch up before the split");
    promote(&replica).await;
    let first = old.lock(&key).await.unwrap();
    let new = LockClient::new(connect(&redis_url(replica.addr(), "")).await).with_defaults(long);
    let second = new.lock(&key).await.unwrap();
    assert!(first.is_held() && second.is_held(), "two holders at once");
    assert!(
        second.token() > first.token(),
        "the promoted replica's token {} is not above the old primary's {}",
        second.token(),
        first.token()
    );
}

/// (g) The same split with `replicas=1`: the old primary cannot get its grant confirmed
/// by the replica that left it, so it rolls the grant back and hands out no guard; only
/// the new primary grants the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_confirmation_a_promotion_leaves_one_holder() {
    let (primary, replica) = primary_and_replica().await;
    let key = key("split-confirmed");
    let long = options(Duration::from_secs(30), Renewal::Manual);
    let old =
        LockClient::new(connect(&confirmed_url(&primary, "1")).await).with_defaults(long.clone());
    old.lock(&key).await.unwrap().release().await.unwrap();
    promote(&replica).await;
    let refused = old.lock(&key).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Unavailable, "{refused}");
    assert_eq!(
        entry(primary.addr(), &lock_key("distlock:", &key)).await,
        None,
        "the unconfirmed grant is still on the old primary"
    );
    let new = LockClient::new(connect(&redis_url(replica.addr(), "")).await).with_defaults(long);
    new.lock(&key).await.unwrap().release().await.unwrap();
}
