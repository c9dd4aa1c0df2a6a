//! `distlock::blocking` from plain threads: locks exclude, waits are bounded, leases stay
//! renewed while the thread works (or by hand), a dropped guard has freed the key in the
//! store by the time the drop returns, and the patterns (once, idempotent, with_lock) run
//! their synchronous work on the calling thread.
#![cfg(feature = "blocking")]

use std::time::{Duration, Instant};

use std::cell::Cell;
use std::rc::Rc;

use distlock::blocking::{connect, LockClient};
use distlock::{ErrorKind, Execution, LossReason, Renewal};

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

/// A lease renewed by hand outlives its TTL while renewed, then is lost when the renewals
/// stop, and a renewal after that is `Lost`.
#[test]
fn a_manually_renewed_lease_lives_while_renewed() {
    let (_dir, a, b) = two_clients("manual");
    let ttl = Duration::from_millis(600);
    let guard = a
        .lock("blocking/manual")
        .ttl(ttl)
        .renewal(Renewal::Manual)
        .acquire()
        .unwrap();
    let first = guard.lease().expect("held").valid_until();
    for _ in 0..4 {
        // A step of the work, a third of the TTL, then the renewal.
        std::thread::sleep(ttl / 3);
        guard.renew().unwrap();
    }
    assert!(guard.is_held(), "lost: {:?}", guard.loss_reason());
    assert!(guard.lease().expect("held").valid_until() > first + ttl);
    assert_eq!(
        b.try_lock("blocking/manual").acquire().unwrap_err().kind(),
        ErrorKind::HeldByAnother
    );
    assert_eq!(guard.lost_within(Duration::ZERO), None);
    let reason = guard
        .lost_within(ttl * 10)
        .expect("a lease nobody renews was never lost");
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert_eq!(guard.renew().unwrap_err().kind(), ErrorKind::Lost);
    assert_eq!(guard.release().unwrap_err().kind(), ErrorKind::Lost);
}

/// Two replicas ask for the same window: the job runs once, and a finished ticket keeps
/// the key taken for `at_least`.
#[test]
fn a_once_job_runs_once_across_two_calls() {
    let (_dir, a, b) = two_clients("once");
    let runs = Cell::new(0);
    let run_if_first = |client: &LockClient| -> distlock::Result<bool> {
        let ticket = client
            .once("blocking/nightly")
            .at_least(Duration::from_secs(60))
            .at_most(Duration::from_secs(600))
            .acquire()?;
        let Some(ticket) = ticket else {
            return Ok(false);
        };
        assert!(ticket.is_held());
        assert_eq!(ticket.key().as_str(), "blocking/nightly");
        runs.set(runs.get() + 1);
        ticket.finish()?;
        Ok(true)
    };
    assert!(run_if_first(&a).unwrap());
    assert!(!run_if_first(&b).unwrap());
    assert!(!run_if_first(&a).unwrap());
    assert_eq!(runs.get(), 1);
}

/// A retry replays the recorded result without running the work; a failed run records
/// nothing and hands back the work's own error, which need not be `Send`.
#[test]
fn an_idempotent_retry_replays_the_recorded_result() {
    let (_dir, a, b) = two_clients("idempotent");
    let runs = Cell::new(0);
    let failed = a
        .idempotent("blocking/payment")
        .run(|_| Err::<Vec<u8>, _>(Rc::new("card declined")))
        .unwrap();
    assert!(matches!(failed, Execution::Failed(err) if *err == "card declined"));
    let charge = |scope: distlock::LockScope| {
        assert!(scope.is_held());
        runs.set(runs.get() + 1);
        Ok::<_, String>(format!("charged under {}", scope.token()).into_bytes())
    };
    let first = a.idempotent("blocking/payment").run(charge).unwrap();
    let Execution::Ran(recorded) = first else {
        panic!("expected a run, got {first:?}");
    };
    let retry = b.idempotent("blocking/payment").run(charge).unwrap();
    assert_eq!(retry, Execution::Replayed(recorded));
    assert_eq!(runs.get(), 1);
}

/// `run_json` gives the first caller and every retry the same typed value.
#[cfg(feature = "serde")]
#[test]
fn an_idempotent_typed_result_is_replayed() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Receipt {
        cents: u64,
    }
    let (_dir, a, b) = two_clients("run-json");
    let first = a
        .idempotent("blocking/receipt")
        .run_json(|_| Ok::<_, String>(Receipt { cents: 1000 }))
        .unwrap();
    assert_eq!(first, Execution::Ran(Receipt { cents: 1000 }));
    let retry = b
        .idempotent("blocking/receipt")
        .run_json(|_| Err::<Receipt, _>("ran again"))
        .unwrap();
    assert_eq!(retry, Execution::Replayed(Receipt { cents: 1000 }));
}

/// `with_lock` runs its body on this thread (a value that is not `Send` comes back), holds
/// the key while it runs, and frees it after.
#[test]
fn with_lock_returns_the_body_value() {
    let (_dir, a, b) = two_clients("with-lock");
    let value = a
        .with_lock("blocking/scoped", |scope| {
            assert!(scope.is_held());
            assert_eq!(
                b.try_lock("blocking/scoped").acquire().unwrap_err().kind(),
                ErrorKind::HeldByAnother
            );
            Rc::new(scope.token())
        })
        .unwrap();
    let next = b.try_lock("blocking/scoped").acquire().unwrap();
    assert!(next.token() > *value);
    next.release().unwrap();
}

/// A lock lost while the body runs cannot stop the body: it runs to its end, and the call
/// fails with `Lost` instead of returning its value.
#[test]
fn with_lock_reports_a_loss_during_the_body() {
    let (_dir, a, b) = two_clients("with-lock-lost");
    let ttl = Duration::from_millis(300);
    let finished = Cell::new(false);
    let result = a
        .lock("blocking/scoped-lost")
        .ttl(ttl)
        .renewal(Renewal::Manual)
        .scoped(|scope| {
            let deadline = Instant::now() + ttl * 20;
            while scope.is_held() {
                assert!(
                    Instant::now() < deadline,
                    "the unrenewed lease was never lost"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            finished.set(true);
            "done"
        });
    assert!(finished.get());
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Lost);
    b.lock("blocking/scoped-lost")
        .wait_up_to(ttl * 10)
        .acquire()
        .expect("the lost lock is free")
        .release()
        .unwrap();
}
