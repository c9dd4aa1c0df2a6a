//! Replies delayed on the wire past the TTL, through a TCP proxy in front of a private
//! PostgreSQL or MariaDB server: a grant that arrives after its deadline is never handed out.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use conformance_tests::network::grant_delayed_past_ttl_is_never_handed_out;
use conformance_tests::proxy::TcpFaultProxy;
use lock_core::{AcquireOptions, LockClient};
use support::Database;

async fn late_replies(db: Database) {
    let proxy = TcpFaultProxy::start(db.server.as_ref().unwrap().addr())
        .await
        .unwrap();
    let options = AcquireOptions {
        request_timeout: Duration::from_secs(2),
        ..AcquireOptions::default()
    };
    let delayed = LockClient::new(
        lock_sql::connect(&db.url_via(proxy.addr().port()))
            .await
            .unwrap(),
    )
    .with_defaults(options.clone());
    let direct = LockClient::new(db.backend().await).with_defaults(options);
    let key = format!("late-replies/{}", lock_core::LeaseId::random());
    grant_delayed_past_ttl_is_never_handed_out(
        &delayed,
        &direct,
        &[&proxy],
        &key,
        Duration::from_millis(200),
        Duration::from_millis(150),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_late_grant_is_never_handed_out() {
    late_replies(Database::postgres().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_late_grant_is_never_handed_out() {
    late_replies(Database::mariadb().await.unwrap()).await;
}
