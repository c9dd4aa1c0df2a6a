//! Clean-ups that fail while the store is unreachable are retried once it answers again:
//! an entry nobody wants never blocks a key for longer than the store takes to come back,
//! even where it would otherwise live as long as the client's session.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use lock_core::{ErrorKind, LockClient};

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{eventually, released, Ctx, Failure, Outcome, SLACK};

/// How soon after the store answers again a retried clean-up must have landed: the core's
/// longest pause between tries (2 s), one try, and slack; far below the TTL, so only the
/// retry can pass it.
fn retried_within(ctx: &Ctx) -> Duration {
    Duration::from_secs(2) + ctx.options().request_timeout + SLACK * 2
}

/// Gets `key` with `client` within [`retried_within`], and releases it.
async fn granted_soon(ctx: &Ctx, client: &LockClient, key: &str, what: &str) -> Outcome {
    let bound = retried_within(ctx);
    let started = Instant::now();
    let guard = client.lock(key).wait_up_to(bound).await.map_err(|err| {
        Failure(format!(
            "{what}: a third client did not get the key within {bound:?} \
                 ({:?} after the store answered again): {err}",
            started.elapsed()
        ))
    })?;
    released(guard.release().await, "the third client lost its lease")
}

/// A waiter whose bounded wait ends while the store cannot be told (its leave and the
/// releases of its attempt fail) leaves the queue once the store answers again: after the
/// holder releases, a third client gets the key within seconds, not after the waiter's
/// TTL or, on a session store, never.
pub async fn waiter_that_gave_up_during_an_outage_leaves_the_queue(ctx: &Ctx) -> Outcome {
    let key = ctx.key("gave-up");
    let holder = ctx.client().await?;
    let (waiter, faulty) = ctx.faulty_client().await?;
    let third = ctx.client().await?;
    let held = holder.lock(&key).await?;
    let wait = Duration::from_secs(1);
    let waiting = tokio::spawn(waiter.lock(&key).wait_up_to(wait).into_future());
    eventually(wait, "the waiter queues", || async {
        Ok(holder.inspect(&key).await?.and_then(|info| info.waiters) == Some(1))
    })
    .await?;
    let queue_calls = faulty.calls(Op::Queue);
    faulty.inject(Op::Queue, Fault::Fail(ErrorKind::Unavailable));
    faulty.inject(Op::Release, Fault::Fail(ErrorKind::Unavailable));
    let ended = waiting
        .await
        .map_err(|err| Failure(format!("the waiter panicked: {err}")))?;
    ensure!(
        ended
            .as_ref()
            .is_err_and(|err| err.kind() == ErrorKind::TimedOut),
        "the waiter's wait should time out behind the holder, got {:?}",
        ended.map(|guard| guard.token())
    );
    // The leave and both scheduled releases of its attempt were tried, and failed.
    eventually(
        ctx.options().request_timeout * 2 + SLACK * 2,
        "the waiter's clean-ups are tried while the store is unreachable",
        || async { Ok(faulty.calls(Op::Queue) > queue_calls && faulty.calls(Op::Release) >= 2) },
    )
    .await?;
    ensure!(
        holder.inspect(&key).await?.and_then(|info| info.waiters) == Some(1),
        "the waiter's entry should still be queued while its leave fails"
    );
    faulty.heal();
    released(held.release().await, "the holder lost its lease")?;
    granted_soon(ctx, &third, &key, "after the waiter gave up").await
}

/// A guard dropped while the store cannot be reached, whose release keeps failing until
/// the lease's deadline has passed, is released once the store answers again. On a
/// session store the entry would otherwise live, renewed with the session, for as long as
/// the client runs.
pub async fn release_that_failed_until_the_deadline_is_retried(ctx: &Ctx) -> Outcome {
    let key = ctx.key("release-retried");
    let (holder, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    let guard = holder.lock(&key).ttl(ctx.short_ttl()).await?;
    let deadline = guard.lease().valid_until();
    faulty.inject(Op::Release, Fault::Fail(ErrorKind::Unavailable));
    drop(guard);
    // The background release retries while the lease is valid and then gives up: waiting
    // for the deadline (plus one try) is waiting for that event.
    let given_up = deadline + ctx.options().request_timeout + SLACK;
    tokio::time::sleep_until(given_up.into()).await;
    ensure!(
        faulty.calls(Op::Release) >= 1,
        "the dropped guard never tried to release"
    );
    faulty.heal();
    granted_soon(ctx, &rival, &key, "after the failed release").await
}
