//! `distlock::connect` reaches each server backend by URL: a private server per store,
//! started by the store-process fixture, locked and released through the facade.

use std::time::Duration;

use distlock::LockClient;

/// Locks a key through the facade client, sees a second client refused, releases.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
async fn lock_through(client: &LockClient, other: &LockClient) {
    let guard = client
        .lock("facade/connect")
        .ttl(Duration::from_secs(5))
        .wait_up_to(Duration::from_secs(10))
        .await
        .expect("lock through the facade");
    let refused = other.try_lock("facade/connect").await.expect_err("held");
    assert_eq!(refused.kind(), distlock::ErrorKind::HeldByAnother);
    guard.release().await.expect("release");
    other
        .try_lock("facade/connect")
        .await
        .expect("free after release")
        .release()
        .await
        .expect("release");
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_urls_connect() {
    use conformance_tests::store_process::{StoreProcess, StoreSpec};
    let spec = StoreSpec::etcd().expect("etcd spec");
    let server = StoreProcess::start(spec).await.expect("etcd server");
    let url = format!("etcd://{}/facade-test", server.addr());
    let a = distlock::connect(&url).await.expect("connect");
    let b = distlock::connect(&url).await.expect("connect");
    lock_through(&a, &b).await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_urls_connect() {
    use conformance_tests::store_process::{StoreProcess, StoreSpec};
    let server = StoreProcess::start(StoreSpec::zookeeper())
        .await
        .expect("zookeeper server");
    // A chroot must exist before use (the backend refuses a missing one): none here.
    let url = format!("zk://{}", server.addr());
    let a = distlock::connect(&url).await.expect("connect");
    let b = distlock::connect(&url).await.expect("connect");
    lock_through(&a, &b).await;
}

#[test]
fn every_compiled_backend_is_listed() {
    let schemes = distlock::supported_schemes();
    #[cfg(feature = "etcd")]
    assert!(schemes.contains(&"etcd"), "{schemes:?}");
    #[cfg(feature = "zookeeper")]
    assert!(schemes.contains(&"zk"), "{schemes:?}");
    assert!(schemes.contains(&"memory"), "{schemes:?}");
}
