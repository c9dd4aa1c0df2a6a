//! Credentials: refused ones are `PermissionDenied`, and passwords never show in errors or
//! `Debug` output.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use lock_core::backend::{default_drift_allowance, AcquireRequest};
use lock_core::{ErrorKind, LockKey, Renewal};
use support::start_redis;

const PASSWORD: &str = "s3cret-Pw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_password_is_permission_denied_and_never_shown() {
    let server = start_redis().await;
    let raw = redis::Client::open(format!("redis://{}/0", server.addr())).unwrap();
    let mut admin = raw.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query_async(&mut admin)
        .await
        .unwrap();
    let addr = server.addr();

    let wrong = lock_redis::connect(&format!("redis://:wrong-{PASSWORD}@{addr}/0")).await;
    let err = wrong.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains(PASSWORD), "{shown}");
    }

    let ttl = Duration::from_secs(5);
    let request = AcquireRequest::new(
        LockKey::new("k").unwrap(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    );
    let anonymous = lock_redis::connect(&format!("redis://{addr}/0")).await;
    let err = match anonymous {
        Ok(backend) => backend.try_acquire(&request).await.unwrap_err(),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");

    let url = format!("redis://:{PASSWORD}@{addr}/0");
    let backend = lock_redis::connect(&url).await.unwrap();
    assert!(backend.try_acquire(&request).await.unwrap().is_some());
    assert!(!format!("{backend:?}").contains(PASSWORD));
    let config = lock_redis::RedisConfig::from_url(&url).unwrap();
    assert!(!format!("{config:?}").contains(PASSWORD));
    let err = lock_redis::connect(&format!("{url}?bogus=1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!err.to_string().contains(PASSWORD), "{err}");
}

/// E1: a user name and password full of URL-reserved characters, percent-encoded in the
/// URL, authenticate (they reach the server decoded); unencoded, the URL is refused; and
/// neither form ever shows the password, in errors, their sources or `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_characters_in_credentials_authenticate_when_percent_encoded() {
    const USER: &str = "app@x:1";
    const SECRET: &str = "p/ss?w#rd@:%&=+ é";
    let server = start_redis().await;
    let raw = redis::Client::open(format!("redis://{}/0", server.addr())).unwrap();
    let mut admin = raw.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(USER)
        .arg("on")
        .arg(format!(">{SECRET}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut admin)
        .await
        .unwrap();
    let encode = |text: &str| -> String {
        text.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let addr = server.addr();
    let shown = conformance_tests::everything_shown;

    let url = format!("redis://{}:{}@{addr}/0", encode(USER), encode(SECRET));
    let backend = lock_redis::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(5);
    let request = AcquireRequest::new(
        LockKey::new("reserved").unwrap(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    );
    assert!(backend.try_acquire(&request).await.unwrap().is_some());
    assert!(!format!("{backend:?}").contains(SECRET));

    let wrong = format!("redis://{}:{}x@{addr}/0", encode(USER), encode(SECRET));
    let err = lock_redis::connect(&wrong).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!shown(&err).contains(SECRET), "{}", shown(&err));

    let unencoded = format!("redis://{}:{SECRET}@{addr}/0", encode(USER));
    let err = lock_redis::connect(&unencoded).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    for part in ["p/ss", "w#rd", SECRET] {
        assert!(!shown(&err).contains(part), "{}", shown(&err));
    }
}
