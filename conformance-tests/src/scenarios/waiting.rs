//! Try-lock, bounded waits, prompt wake-ups and fair queues.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::lock_unpoisoned;
use lock_core::{AcquireOptions, Backoff, ErrorKind, LockKey};

use crate::ensure;
use crate::faults::{Fault, FaultyBackend, Op};
use crate::harness::released;
use crate::harness::{
    eventually, expect_kind, granted_within, spawn_lock, within, Ctx, Failure, Outcome, SLACK,
};

/// A try-lock on a held key fails at once with "held by another".
pub async fn try_lock_returns_at_once(ctx: &Ctx) -> Outcome {
    let key = ctx.key("try-lock");
    let (holder, rival) = (ctx.client().await?, ctx.client().await?);
    let guard = holder.lock(&key).await?;
    let started = Instant::now();
    let err = expect_kind(
        rival.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "try-lock of a held key",
    )?;
    ensure!(
        started.elapsed() < SLACK,
        "try-lock took {:?}",
        started.elapsed()
    );
    ensure!(err.is_retryable(), "held-by-another must be retryable");
    released(guard.release().await, "holder lost its lease")?;
    ensure!(
        rival.inspect(&key).await?.is_none(),
        "the failed try-lock left a hold behind"
    );
    Ok(())
}

/// A bounded wait on a held key ends with "timed out" within the bound plus slack and
/// leaves nothing behind.
pub async fn bounded_wait_times_out(ctx: &Ctx) -> Outcome {
    let key = ctx.key("bounded-wait");
    let bound = Duration::from_millis(400);
    let (holder, waiter) = (ctx.client().await?, ctx.client().await?);
    let guard = holder.lock(&key).await?;
    let started = Instant::now();
    expect_kind(
        waiter.lock(&key).wait_up_to(bound).await,
        ErrorKind::TimedOut,
        "bounded wait",
    )?;
    let waited = started.elapsed();
    ensure!(
        waited >= bound,
        "gave up after {waited:?}, before the bound of {bound:?}"
    );
    ensure!(
        waited <= bound + SLACK,
        "gave up after {waited:?}, bound {bound:?}"
    );
    released(guard.release().await, "holder lost its lease")?;
    ensure!(
        waiter.inspect(&key).await?.is_none(),
        "the timed-out waiter left a hold behind"
    );
    let residue = ctx.factory().residue(&key).await?;
    ensure!(
        residue.is_empty(),
        "the timed-out waiter left state behind: {residue:?}"
    );
    Ok(())
}

/// Waits until the waiter behind `faulty` has made an attempt that found the key held,
/// so the release that follows really has to wake it.
async fn until_waiting(ctx: &Ctx, faulty: &FaultyBackend, key: &str, before: u64) -> Outcome {
    until_n_waiting(ctx, faulty, key, before, 1).await
}

/// Waits until `n` waiters behind `faulty` have each found the key held at least once.
async fn until_n_waiting(
    ctx: &Ctx,
    faulty: &FaultyBackend,
    key: &str,
    before: u64,
    n: u64,
) -> Outcome {
    if ctx.capabilities().fair_ordering {
        let (observer, key) = (ctx.backend().await?, LockKey::new(key)?);
        eventually(SLACK * 10, "the waiter queues", || async {
            Ok(observer
                .inspect(&key)
                .await?
                .and_then(|info| info.waiters)
                .is_some_and(|queued| queued as u64 >= n))
        })
        .await
    } else {
        eventually(SLACK * 10, "the waiter's first attempt", || async {
            Ok(faulty.completed(Op::Acquire) >= before + n)
        })
        .await
    }
}

/// A fair queue's waiter whose last attempt is still on its way when the wait runs out
/// times out (`TimedOut`): the store answered its enqueue, so it is not unavailable, the
/// wait is simply over. It leaves no entry behind.
pub async fn queued_wait_times_out_while_its_attempt_is_slow(ctx: &Ctx) -> Outcome {
    queued_wait_times_out_while_slow(ctx, Op::Acquire, SLACK * 4).await
}

/// A queued wait that times out returns within its bound even when leaving the queue is
/// slow: the leave finishes in the background, and the key is free for others once it
/// has landed.
pub async fn queued_wait_times_out_while_its_leave_is_slow(ctx: &Ctx) -> Outcome {
    let slow_leave = QUEUED_WAIT * 3;
    queued_wait_times_out_while_slow(ctx, Op::Queue, slow_leave + SLACK * 4).await
}

const QUEUED_WAIT: Duration = Duration::from_millis(300);

/// A queued wait of [`QUEUED_WAIT`] whose `slow` calls reach the store three bounds late
/// (only those after its enqueue was answered, for [`Op::Queue`]) times out within its
/// bound, and the key is free for the next holder within `free_within` of the release.
async fn queued_wait_times_out_while_slow(ctx: &Ctx, slow: Op, free_within: Duration) -> Outcome {
    let key = ctx.key(&format!("queued-slow-{slow:?}"));
    let bound = QUEUED_WAIT;
    let holder = ctx.client().await?;
    let (waiter, faulty) = ctx.faulty_client().await?;
    let guard = holder.lock(&key).await?;
    if slow != Op::Queue {
        faulty.inject(slow, Fault::Delay(bound * 3));
    }
    let started = Instant::now();
    let wait = tokio::spawn(waiter.lock(&key).wait_up_to(bound).into_future());
    if slow == Op::Queue {
        eventually(bound, "the waiter's enqueue answered", || async {
            Ok(faulty.completed(Op::Queue) >= 1)
        })
        .await?;
        faulty.inject(slow, Fault::Delay(bound * 3));
    }
    let result = within(bound * 4, "the queued wait's end", wait)
        .await?
        .map_err(|err| Failure(format!("the waiter panicked: {err}")))?;
    expect_kind(
        result,
        ErrorKind::TimedOut,
        &format!("a queued wait with slow {slow:?} calls"),
    )?;
    ensure!(
        started.elapsed() <= bound + SLACK,
        "gave up after {:?}, bound {bound:?}",
        started.elapsed()
    );
    faulty.heal();
    released(guard.release().await, "holder lost its lease")?;
    let next = within(
        free_within,
        "a free key after the timed-out waiter",
        async { holder.lock(&key).wait_up_to(free_within).await },
    )
    .await??;
    released(next.release().await, "next holder")?;
    Ok(())
}

/// A waiter gets the key promptly after release: within the notification path's latency
/// where the store notifies (the fallback poll is set far longer), or within one poll
/// interval where it does not.
pub async fn waiter_wakes_promptly_after_release(ctx: &Ctx) -> Outcome {
    let (backoff, bound) = wake_up_bound(ctx);
    release_wakes_waiter(ctx, "wake", backoff, bound, false).await
}

/// The backoff a waiter uses in the wake-up scenarios, and how soon after a release it
/// must have the key: the fallback poll is made far longer than the bound where the store
/// notifies, so meeting the bound proves the notification path.
fn wake_up_bound(ctx: &Ctx) -> (Backoff, Duration) {
    let backoff = if ctx.capabilities().native_notification {
        Backoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(5),
        }
    } else {
        Backoff::default()
    };
    let bound = if ctx.capabilities().native_notification {
        SLACK
    } else {
        backoff.max + SLACK
    };
    (backoff, bound)
}

/// Several waiters of one client, queued behind a holder, all get the key in turn, each
/// within one wake-up of the previous release: no release is lost between them, however
/// the client hands wake-ups to its waiters.
pub async fn waiters_take_turns_promptly(ctx: &Ctx) -> Outcome {
    const WAITERS: u64 = 4;
    let key = ctx.key("turns");
    let holder = ctx.client().await?;
    let (waiters, faulty) = ctx.faulty_client().await?;
    let (backoff, bound) = wake_up_bound(ctx);
    let hold = Duration::from_millis(20);
    let guard = holder.lock(&key).await?;
    let before = faulty.completed(Op::Acquire);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WAITERS {
        let (client, key) = (waiters.clone(), key.clone());
        let options = AcquireOptions {
            backoff,
            ..ctx.options()
        };
        tasks.spawn(async move {
            let guard = client.lock(&key).options(options).await?;
            tokio::time::sleep(hold).await; // the critical section itself
            guard.release().await?;
            Ok(())
        });
    }
    // The client's waiters line up locally behind the one that waits in the store.
    until_n_waiting(ctx, &faulty, &key, before, 1).await?;
    eventually(
        SLACK * 10,
        "the other waiters to line up locally",
        || async { Ok(waiters.local_waiters(&key) as u64 == WAITERS - 1) },
    )
    .await?;
    let released_at = Instant::now();
    released(guard.release().await, "holder lost its lease")?;
    let limit = (hold + bound) * WAITERS as u32;
    crate::harness::join_all(limit + Duration::from_secs(10), "waiters", &mut tasks).await?;
    let took = released_at.elapsed();
    ensure!(
        took <= limit,
        "{WAITERS} waiters took {took:?} to get the key in turn (bound {limit:?})"
    );
    Ok(())
}

/// A waiter still gets the key when the release notification is lost: the fallback poll
/// bounded by the backoff cap covers it.
pub async fn waiter_wakes_despite_dropped_notification(ctx: &Ctx) -> Outcome {
    let backoff = Backoff {
        initial: Duration::from_millis(300),
        max: Duration::from_millis(300),
    };
    release_wakes_waiter(
        ctx,
        "dropped-notification",
        backoff,
        backoff.max + SLACK,
        true,
    )
    .await
}

/// Holds a key until a waiter (polling with `backoff`, its notifications dropped if asked)
/// is waiting, releases it, and checks the waiter got it within `bound`.
async fn release_wakes_waiter(
    ctx: &Ctx,
    name: &str,
    backoff: Backoff,
    bound: Duration,
    drop_notifications: bool,
) -> Outcome {
    let key = ctx.key(name);
    let holder = ctx.client().await?;
    let (waiter, faulty) = ctx.faulty_client().await?;
    if drop_notifications {
        faulty.inject(Op::Watch, Fault::DropNotifications);
    }
    let guard = holder.lock(&key).await?;
    let before = faulty.completed(Op::Acquire);
    let task = spawn_lock(
        waiter,
        &key,
        AcquireOptions {
            backoff,
            ..ctx.options()
        },
    );
    until_waiting(ctx, &faulty, &key, before).await?;
    if drop_notifications {
        ensure!(
            faulty.calls(Op::Watch) > 0,
            "the waiter never subscribed to notifications"
        );
    }
    let released_at = Instant::now();
    released(guard.release().await, "holder lost its lease")?;
    let (got, got_at) = granted_within(bound + Duration::from_secs(5), "waiter", task).await?;
    let latency = got_at - released_at;
    ensure!(
        latency <= bound,
        "the waiter took {latency:?} after the release (bound {bound:?})"
    );
    got.release().await?;
    Ok(())
}

/// Waiters get the key in arrival order; one that dies while queued is skipped and leaves
/// no trace.
pub async fn fifo_order_with_dead_waiter(ctx: &Ctx) -> Outcome {
    let key = ctx.key("fifo");
    let lock_key = LockKey::new(&key)?;
    let holder = ctx.client().await?;
    let observer = ctx.backend().await?;
    let guard = holder.lock(&key).await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for name in ["first", "dies", "third"] {
        let client = ctx.client().await?;
        let (key, order) = (key.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client.lock(&key).await?;
            lock_unpoisoned(&order).push(name);
            guard.release().await?;
            Ok::<(), Failure>(())
        }));
        let queued = waiters.len();
        eventually(Duration::from_secs(5), "waiter queued", || async {
            let info = observer.inspect(&lock_key).await?;
            Ok(info.and_then(|i| i.waiters).is_some_and(|n| n >= queued))
        })
        .await?;
    }
    waiters[1].abort();
    eventually(
        Duration::from_secs(5),
        "dead waiter leaves the queue",
        || async {
            let info = observer.inspect(&lock_key).await?;
            Ok(info.and_then(|i| i.waiters) == Some(2))
        },
    )
    .await?;
    guard.release().await?;
    for (index, waiter) in waiters.into_iter().enumerate() {
        if index == 1 {
            continue;
        }
        within(Duration::from_secs(10), "queued waiter", waiter)
            .await?
            .map_err(|e| Failure(format!("waiter task failed: {e}")))??;
    }
    let order = lock_unpoisoned(&order).clone();
    ensure!(order == vec!["first", "third"], "grant order was {order:?}");
    let residue = ctx.factory().residue(&key).await?;
    ensure!(
        residue.is_empty(),
        "the queue left state behind: {residue:?}"
    );
    Ok(())
}

/// Setting up the store's notifications is bounded by the wait: a subscription that never
/// completes makes the waiter poll, and a bounded wait for a free key still gets it.
pub async fn subscription_setup_is_bounded_by_the_wait(ctx: &Ctx) -> Outcome {
    let key = ctx.key("slow-subscription");
    let (client, faulty) = ctx.faulty_client().await?;
    faulty.inject(Op::Watch, Fault::BlackHole);
    let bound = Duration::from_millis(500);
    let guard = within(
        bound + SLACK,
        "a bounded wait whose subscription hangs",
        client.lock(&key).wait_up_to(bound),
    )
    .await??;
    released(guard.release().await, "lease gone at release")?;
    let holder = ctx.client().await?;
    let held = holder.lock(&key).await?;
    let waiter = spawn_lock(
        client.clone(),
        &key,
        AcquireOptions {
            wait: lock_core::Wait::UpTo(Duration::from_secs(10)),
            ..ctx.options()
        },
    );
    released(held.release().await, "holder lost its lease")?;
    // No notification can come: the fallback poll (at most the backoff cap) finds it.
    let (guard, _) = granted_within(
        ctx.options().backoff.max + SLACK * 2,
        "a polling waiter after release",
        waiter,
    )
    .await?;
    released(guard.release().await, "lease gone at release")?;
    Ok(())
}
