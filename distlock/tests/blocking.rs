//! `distlock::blocking` from plain threads: locks exclude, waits are bounded, leases stay
//! renewed while the thread works, and a dropped guard has freed the key in the store by
//! the time the drop returns.
#![cfg(feature = "blocking")]

use std::time::{Duration, Instant};

use distlock::blocking::{connect, LockClient};
use distlock::ErrorKind;

/// Two clients of a store of this test's own, each with its own runtime and connection:
/// a SQLite file when the feature is on (removed with the returned directory), else a
/// named memory store.
fn two_clients(name: &str) -> (Option<tempfile::TempDir>, LockClient, LockClient) {
    let (dir, url) = if cfg!(feature = "sqlite") {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        (Some(dir), url)
    } else {
        (None, format!("memory://blocking-{name}"))
    };
    (
        dir,
        connect(&url).expect("connect"),
        connect(&url).expect("connect"),
    )
}

#[test]
fn a_held_key_is_refused_and_free_after_release() {
    let (_dir, a, b) = two_clients("release");
    let guard = a
        .lock("blocking/k")
        .ttl(Duration::from_secs(10))
        .acquire()
        .unwrap();
    assert!(guard.is_held());
    assert_eq!(guard.key().as_str(), "blocking/k");
    let refused = b.try_lock("blocking/k").acquire().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::HeldByAnother);
    let status = b.inspect("blocking/k").unwrap().expect("held");
    assert_eq!(status.token, guard.token());
    let first = guard.token();
    guard.release().unwrap();
    let next = b.try_lock("blocking/k").acquire().unwrap();
    assert!(next.token() > first, "{:?} after {first:?}", next.token());
    next.release().unwrap();
}

/// Without a runtime around the drop, the async guard's own drop could not release: the
/// blocking guard releases through its client's runtime and waits for the store.
#[test]
fn a_dropped_guard_has_released_when_the_drop_returns() {
    let (_dir, a, b) = two_clients("dropped");
    let guard = a
        .lock("blocking/dropped")
        .ttl(Duration::from_secs(30))
        .acquire()
        .unwrap();
    drop(guard);
    b.try_lock("blocking/dropped")
        .acquire()
        .expect("free at once, not after the 30 s TTL")
        .release()
        .unwrap();
}

/// A bounded wait ends with `TimedOut`; a waiting thread gets the key once it is
/// released by another.
#[test]
fn waits_are_bounded_and_served() {
    let (_dir, a, b) = two_clients("wait");
    let guard = a.lock("blocking/wait").acquire().unwrap();
    let started = Instant::now();
    let err = b
        .lock("blocking/wait")
        .wait_up_to(Duration::from_millis(200))
        .acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(started.elapsed() >= Duration::from_millis(200));

    let waiter = std::thread::spawn(move || {
        b.lock("blocking/wait")
            .wait_up_to(Duration::from_secs(30))
            .acquire()
            .map(|next| next.token())
    });
    // The waiter may or may not be waiting yet: either way it must get the key.
    let first = guard.token();
    guard.release().unwrap();
    let next = waiter.join().unwrap().unwrap();
    assert!(next > first);
}

/// The client's runtime renews the lease while the calling thread is busy with
/// synchronous work for several TTLs.
#[test]
fn a_lease_stays_renewed_while_the_thread_works() {
    let a = connect("memory://blocking-renewal").unwrap();
    let b = connect("memory://blocking-renewal").unwrap();
    let ttl = Duration::from_millis(300);
    let guard = a.lock("k").ttl(ttl).acquire().unwrap();
    // The work under the lock, not a wait for an event: three TTLs of blocking work.
    std::thread::sleep(3 * ttl);
    assert!(guard.is_held(), "lost: {:?}", guard.loss_reason());
    assert_eq!(
        b.try_lock("k").acquire().unwrap_err().kind(),
        ErrorKind::HeldByAnother
    );
    guard.release().unwrap();
}

/// `shutdown` gives back what the client holds although the guard lives on.
#[test]
fn shutdown_releases_what_the_client_holds() {
    let a = connect("memory://blocking-shutdown").unwrap();
    let b = connect("memory://blocking-shutdown").unwrap();
    let guard = a.lock("k").acquire().unwrap();
    a.shutdown().unwrap();
    assert!(!guard.is_held());
    b.try_lock("k").acquire().unwrap().release().unwrap();
    guard.release().unwrap();
}

/// Called from an async task (where `Handle::block_on` and dropping a runtime panic), the
/// blocking client still works, and its runtime shuts down without waiting.
#[tokio::test(flavor = "current_thread")]
async fn works_and_drops_inside_an_async_runtime() {
    let client = connect("memory://blocking-in-async").unwrap();
    let guard = client.lock("k").acquire().unwrap();
    assert!(guard.is_held());
    drop(guard);
    client.try_lock("k").acquire().unwrap().release().unwrap();
    drop(client);
}

/// Errors of `connect` are the facade's.
#[test]
fn bad_urls_are_refused() {
    let err = connect("nosuchstore://u:hunter2@127.0.0.1:1/0").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
