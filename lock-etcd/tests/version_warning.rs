//! The version warning at connect, in a process of its own: it installs the global
//! tracing subscriber, which tests running on other threads of a shared binary would race
//! (a callsite first hit under no subscriber can be cached as uninteresting).

#![allow(clippy::unwrap_used)]

mod support;

use support::{connect, etcd_url, start_etcd, Logs};

/// The tested etcd 3.4.23 predates the fixes for a stuck leader (etcd issues 12528 and
/// 15247): `connect` reads the server's version and warns once, naming the first fixed
/// releases, and still connects.
#[tokio::test]
async fn an_old_server_is_warned_about_once_per_connect() {
    let server = start_etcd().await;
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .without_time()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let version = etcd_client::Client::connect([server.addr().to_string()], None)
        .await
        .unwrap()
        .status()
        .await
        .unwrap()
        .version()
        .to_string();
    let _backend = connect(&etcd_url(&[server.addr()], "")).await;
    let shown = logs.text();
    assert_eq!(
        shown.matches("12528").count(),
        1,
        "server {version}: {shown}"
    );
    assert!(shown.contains("3.4.31"), "server {version}: {shown}");
}
