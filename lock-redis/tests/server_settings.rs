//! Servers set up in ways the backend cannot work with are refused with a message saying
//! what to change; transient server states are `Unavailable`; a restricted ACL user can
//! still release.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lock_core::backend::{default_drift_allowance, AcquireRequest};
use lock_core::{Error, ErrorKind, LockKey, Renewal};
use support::{config_set, raw, redis_url, redlock_url, start_redis, start_redis_nodes};

fn request(name: &str) -> AcquireRequest {
    let ttl = Duration::from_secs(10);
    let key = format!("settings-{:08x}/{name}", fastrand::u32(..));
    AcquireRequest::new(
        LockKey::new(key).unwrap(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    )
}

/// The error's message and every source's, to look for a server's reply in.
fn all_text(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(&format!(" | {s}"));
        source = s.source();
    }
    text
}

async fn acl_user(server: SocketAddr, rules: &[&str]) {
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(rules)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
}

/// S4: a server that may evict keys is refused, single node and in a Redlock, unless the
/// operator accepts it, and then fencing is not declared durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_keys_is_refused_unless_accepted() {
    let server = start_redis().await;
    config_set(server.addr(), "maxmemory-policy", "allkeys-lru").await;
    let err = lock_redis::connect(&redis_url(server.addr(), ""))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
    assert!(err.message().contains("allkeys-lru"), "{err}");
    assert!(err.message().contains("noeviction"), "{err}");

    let accepted = lock_redis::connect(&redis_url(
        server.addr(),
        "allow_eviction=true&durable=true",
    ))
    .await
    .unwrap();
    assert!(!accepted.capabilities().durable_fencing);
    assert!(accepted
        .try_acquire(&request("accepted"))
        .await
        .unwrap()
        .is_some());

    let nodes = start_redis_nodes(3).await;
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr()).collect();
    config_set(addrs[1], "maxmemory-policy", "volatile-ttl").await;
    let err = lock_redis::connect(&redlock_url(&addrs, ""))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
    assert!(err.message().contains("volatile-ttl"), "{err}");
}

/// S4: a user that may not run `CONFIG` connects all the same (the policy is then assumed
/// to be `noeviction`, as documented), and E2: one that may not use the release channel
/// still releases: the delete is not reported as a failure because the notification was
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_acl_user_locks_and_releases() {
    let server = start_redis().await;
    acl_user(
        server.addr(),
        &[
            "app",
            "on",
            ">app-pw",
            "~*",
            "resetchannels",
            "+@all",
            "-config",
        ],
    )
    .await;
    let url = format!("redis://app:app-pw@{}/0", server.addr());
    let backend = lock_redis::connect(&url).await.unwrap();
    let request = request("acl");
    assert!(backend.try_acquire(&request).await.unwrap().is_some());
    assert!(backend
        .release(request.key(), request.lease_id())
        .await
        .unwrap()
        .is_held());
    assert_eq!(backend.inspect(request.key()).await.unwrap(), None);
}

/// E2: a database index the server does not have is a configuration mistake, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_index_out_of_range_is_misconfigured() {
    let server = start_redis().await;
    let err = lock_redis::connect(&format!("redis://{}/99", server.addr()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
    assert!(err.message().contains("databases"), "{err}");
}

/// E2: a server running a long script (`BUSY`) or out of memory (`OOM`) may serve again
/// soon: `Unavailable`, which a waiter rides out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_out_of_memory_servers_are_unavailable() {
    let server = start_redis().await;
    let addr = server.addr();
    let backend = lock_redis::connect(&redis_url(addr, "")).await.unwrap();

    config_set(addr, "maxmemory", "1").await;
    let err = backend.try_acquire(&request("oom")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{}", all_text(&err));
    assert!(all_text(&err).contains("OOM"), "{}", all_text(&err));
    config_set(addr, "maxmemory", "0").await;

    config_set(addr, "busy-reply-threshold", "50").await;
    let mut blocked = raw(addr).await;
    let spin = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query_async::<redis::Value>(&mut blocked)
            .await
    });
    // Acquisitions go through until the script runs, then wait for its threshold.
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        match backend.try_acquire(&request("busy")).await {
            Err(err) => break err,
            Ok(_) => assert!(Instant::now() < deadline, "the server never got busy"),
        }
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{}", all_text(&err));
    assert!(all_text(&err).contains("BUSY"), "{}", all_text(&err));
    let _: redis::Value = redis::cmd("SCRIPT")
        .arg("KILL")
        .query_async(&mut raw(addr).await)
        .await
        .unwrap();
    assert!(spin.await.unwrap().is_err(), "the script was killed");
}

/// E2: a server certificate the client does not trust is a configuration mistake, not a
/// network failure to retry for ever.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_server_certificate_is_misconfigured() {
    use conformance_tests::store_process::{StoreProcess, StoreSpec};

    let spec = StoreSpec::new("redis-server", "redis-server")
        .setup(|dir| {
            let made = std::process::Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                ])
                .args([
                    "-subj",
                    "/CN=localhost",
                    "-keyout",
                    "key.pem",
                    "-out",
                    "cert.pem",
                ])
                .current_dir(dir)
                .output()?;
            if made.status.success() {
                Ok(())
            } else {
                Err(std::io::Error::other(format!("openssl failed: {made:?}")))
            }
        })
        .args(|port, dir| {
            let (port, dir) = (port.to_string(), dir.display().to_string());
            [
                "--port",
                "0",
                "--tls-port",
                &port,
                "--bind",
                "127.0.0.1",
                "--dir",
                &dir,
                "--tls-cert-file",
                "cert.pem",
                "--tls-key-file",
                "key.pem",
                "--tls-ca-cert-file",
                "cert.pem",
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .map(str::to_owned)
            .to_vec()
        });
    let server = StoreProcess::start(spec).await.unwrap();
    let err = lock_redis::connect(&format!("rediss://localhost:{}/0", server.port()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{}", all_text(&err));
    assert!(err.message().contains("TLS"), "{err}");
}
