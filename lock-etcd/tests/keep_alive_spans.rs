//! etcd's keep-alives, the pool's and those a manual renewal asks for, read as every
//! session store's do: in `distlock.keep_alive` spans naming the backend. In a process of
//! its own: it installs the global tracing subscriber.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use lock_core::LockClient;
use support::{connect, etcd_url, start_etcd, Logs};
use tracing_subscriber::fmt::format::FmtSpan;

#[tokio::test]
async fn each_keep_alive_round_trip_is_a_span_naming_etcd() {
    let server = start_etcd().await;
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("lock_core::backend=debug")
        .with_span_events(FmtSpan::CLOSE)
        .without_time()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let client = LockClient::new(connect(&etcd_url(&[server.addr()], "")).await);
    let guard = client
        .lock("kept")
        .ttl(Duration::from_secs(2))
        .await
        .unwrap();
    // A closed span is logged once, with the outcome the answer recorded; there is no
    // event to wait on but the log itself.
    let answered = |line: &str| {
        line.contains(r#"distlock.keep_alive{backend="etcd""#) && line.contains("outcome=Alive")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !logs.text().lines().any(answered) {
        let shown = logs.text();
        assert!(
            Instant::now() < deadline,
            "no answered etcd keep-alive span within 10 s:\n{shown}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    guard.release().await.unwrap();
}
