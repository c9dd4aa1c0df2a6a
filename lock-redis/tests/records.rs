//! Idempotency records as the server keeps them: one key beside the lock entry, with the
//! lock's hash tag, expiring by itself after the retention (no clean-up of ours needed),
//! and refused once the lease's entry is gone even though the record key is free.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use conformance_tests::{eventually, Failure};
use lock_core::backend::{AcquireRequest, LockBackend, Record};
use lock_core::{LeaseId, LockKey, Renewal};
use support::{connect, lock_key, raw, redis_url, start_redis};

#[tokio::test]
async fn a_record_sits_beside_its_lock_and_expires_on_the_server() {
    let server = start_redis().await;
    let backend = connect(&redis_url(server.addr(), "")).await;
    let key = LockKey::new(format!("records/{}", LeaseId::random())).unwrap();
    let lease = LeaseId::random();
    let request = AcquireRequest::new(
        key.clone(),
        Duration::from_secs(30),
        Duration::ZERO,
        Renewal::Manual,
    )
    .with_lease_id(lease);
    let token = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .unwrap()
        .token();
    let record = Record {
        value: b"done".to_vec(),
        fingerprint: None,
        token,
    };
    let retention = Duration::from_millis(300);
    assert!(backend
        .write_record(&key, lease, &record, retention)
        .await
        .unwrap()
        .is_held());
    assert!(backend.release(&key, lease).await.unwrap().is_held());

    let record_key = format!("{}:record", lock_key("distlock:", key.as_str()));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&record_key)
        .query_async(&mut raw(server.addr()).await)
        .await
        .unwrap();
    assert!(
        pttl > 0 && pttl <= 300,
        "the record key has no expiry of its retention (PTTL {pttl})"
    );
    assert_eq!(backend.read_record(&key).await.unwrap(), Some(record));
    // Nothing of ours reads it meanwhile: the server's expiry alone removes it.
    eventually(
        Duration::from_secs(10),
        "the server to drop the record",
        || async {
            let keys: i64 = redis::cmd("DBSIZE")
                .query_async(&mut raw(server.addr()).await)
                .await
                .unwrap();
            // Only the key's fencing counter stays.
            Ok::<_, Failure>(keys == 1)
        },
    )
    .await
    .unwrap();
    assert_eq!(backend.read_record(&key).await.unwrap(), None);
}
