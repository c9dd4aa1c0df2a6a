//! `list_held` over more etcd keys than one page of its range read holds.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures_util::StreamExt;
use lock_core::backend::AcquireRequest;
use lock_core::{LockKey, Renewal};
use support::{connect, etcd_url, start_etcd};

const TTL: Duration = Duration::from_secs(10);

/// 1,500 held keys and one with four waiters whose entries straddle the first page's end
/// (entry 1,000): every key is listed once, in key order, with its own token and waiter
/// count, and a limit cuts the list at the right key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_spans_pages_of_the_range_read() {
    let server = start_etcd().await;
    let backend = connect(&etcd_url(&[server.addr()], "")).await;
    let request = |i: usize| {
        AcquireRequest::new(
            LockKey::new(format!("many/{i:04}")).unwrap(),
            TTL,
            Duration::ZERO,
            Renewal::Auto,
        )
    };
    let held: Vec<(String, u64)> = futures_util::stream::iter(0..1500)
        .map(|i| {
            let backend = backend.clone();
            async move {
                let request = request(i);
                let grant = backend.try_acquire(&request).await.unwrap().unwrap();
                (request.key().as_str().to_string(), grant.token().get())
            }
        })
        .buffered(32)
        .collect()
        .await;
    // Key 997's entries are the 998th to the 1,002nd of the range.
    let crowded = request(997);
    for _ in 0..4 {
        let waiter = AcquireRequest::new(crowded.key().clone(), TTL, Duration::ZERO, Renewal::Auto);
        backend.enqueue(&waiter).await.unwrap();
    }
    let listed = backend.list_held("many/", 2000).await.unwrap();
    let seen: Vec<(String, u64)> = listed
        .iter()
        .map(|(key, info)| (key.as_str().to_string(), info.token.get()))
        .collect();
    assert_eq!(seen, held);
    for (i, (_, info)) in listed.iter().enumerate() {
        let waiters = if i == 997 { 4 } else { 0 };
        assert_eq!(info.waiters, Some(waiters), "key {i}");
        assert!(info.remaining_ttl > Duration::ZERO, "key {i}");
    }
    let first = backend.list_held("many/", 1001).await.unwrap();
    assert_eq!(first.len(), 1001);
    assert_eq!(first.last().unwrap().0.as_str(), "many/1000");
    assert_eq!(first[997].1.waiters, Some(4));
    let one = backend.list_held("many/0998", 10).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].0.as_str(), "many/0998");
}
