//! Holder labels are kept in the lock entry, on a single node and under Redlock: `inspect`
//! shows the label of the lease that holds the key, a takeover replaces it (a lease
//! without a label shows none), and an entry written without one (an older version's)
//! still reads, renews and releases.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::eventually;
use lock_core::backend::{AcquireRequest, DynBackend};
use lock_core::{LeaseId, LockClient, LockKey, Renewal};
use support::{
    lock_key, raw, redis_url, redlock_url, start_redis, start_redis_nodes, REDLOCK_NODES,
};

/// Colons, spaces, quotes and non-ASCII: a label is any text.
const LABEL: &str = "host-a:4242 job \"nightly\" ü🔒";

fn key(name: &str) -> String {
    format!("labels-{:08x}/{name}", fastrand::u32(..))
}

/// A labelled lock shows its label, an unlabelled one none; a takeover of an expired
/// labelled lease by an unlabelled one does not keep the old label.
async fn labels_are_kept_and_replaced(backend: DynBackend) {
    let client = LockClient::new(backend.clone());
    let name = key("kept");
    let guard = client.lock(&name).holder_label(LABEL).await.unwrap();
    let status = client.inspect(&name).await.unwrap().expect("held");
    assert_eq!(status.holder.as_deref(), Some(LABEL));
    assert_eq!(status.token, guard.token());
    // The label stays through renewals.
    guard.renew().await.unwrap();
    let status = client.inspect(&name).await.unwrap().expect("held");
    assert_eq!(status.holder.as_deref(), Some(LABEL));
    guard.release().await.unwrap();

    let key = LockKey::new(&name).unwrap();
    let short = AcquireRequest::new(
        key.clone(),
        Duration::from_millis(100),
        Duration::ZERO,
        Renewal::Manual,
    )
    .with_holder_label(Some(Arc::from("short-lived")));
    backend.try_acquire(&short).await.unwrap().expect("free");
    eventually(
        Duration::from_secs(5),
        "the short lease expires",
        || async { Ok(backend.inspect(&key).await?.is_none()) },
    )
    .await
    .unwrap();
    let guard = client.lock(&name).await.unwrap();
    let status = client.inspect(&name).await.unwrap().expect("held");
    assert_eq!(status.holder, None, "the previous holder's label stayed");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_keeps_labels() {
    let server = start_redis().await;
    labels_are_kept_and_replaced(support::connect(&redis_url(server.addr(), "")).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_labels() {
    let servers = start_redis_nodes(REDLOCK_NODES).await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    labels_are_kept_and_replaced(support::connect(&redlock_url(&addrs, "")).await).await;
}

/// An entry in the format of a version without labels (`<lease>:<token>:<stamp>`) reads
/// as unlabelled, and its lease still renews and releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlabelled_entry_of_an_older_version_still_works() {
    let server = start_redis().await;
    let backend = support::connect(&redis_url(server.addr(), "")).await;
    let name = key("older");
    let key = LockKey::new(&name).unwrap();
    let lease = LeaseId::random();
    let () = redis::cmd("SET")
        .arg(lock_key("distlock:", &name))
        .arg(format!("{lease}:7:0"))
        .arg("PX")
        .arg(60_000)
        .query_async(&mut raw(server.addr()).await)
        .await
        .unwrap();
    let info = backend.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        (info.lease_id, info.token.get(), info.holder),
        (lease, 7, None)
    );
    assert!(backend
        .renew(&key, lease, Duration::from_secs(60))
        .await
        .unwrap()
        .is_held());
    assert!(backend.release(&key, lease).await.unwrap().is_held());
}
