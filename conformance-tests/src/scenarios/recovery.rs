//! Reentrancy, cancellation, ambiguous replies and unreachable stores.

use std::future::IntoFuture;
use std::time::Duration;

use lock_core::backend::{default_drift_allowance, AcquireRequest, LockBackendExt, ReleaseOutcome};
use lock_core::{AcquireOptions, ErrorKind, LockKey, Renewal, Wait};

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::released;
use crate::harness::{
    eventually, expect_kind, unavailable_within, within, Ctx, Failure, Outcome, SLACK,
};

/// An owner re-enters a key it holds with the same token, must release it as often, and
/// only the outermost release frees the key; a plain client is not reentrant.
pub async fn reentrancy_accounting(ctx: &Ctx) -> Outcome {
    let key = ctx.key("reentrant");
    let client = ctx.client().await?;
    let rival = ctx.client().await?;
    let owner = client.owner();
    let outer = owner.lock(&key).await?;
    let inner = within(SLACK, "re-entry", owner.lock(&key).no_wait()).await??;
    ensure!(inner.token() == outer.token(), "re-entry changed the token");
    let from_task = tokio::spawn({
        let (owner, key) = (owner.clone(), key.clone());
        async move { owner.lock(&key).no_wait().await }
    })
    .await
    .map_err(|e| Failure(format!("task failed: {e}")))??;
    ensure!(
        from_task.token() == outer.token(),
        "re-entry from a cloned owner changed the token"
    );
    ensure!(
        owner.holds(&key) == 3,
        "owner counts {} entries, expected 3",
        owner.holds(&key)
    );
    expect_kind(
        rival.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "rival while re-entered",
    )?;
    released(
        from_task.release().await,
        "inner release reported the lock gone",
    )?;
    released(
        inner.release().await,
        "inner release reported the lock gone",
    )?;
    let info = rival
        .inspect(&key)
        .await?
        .ok_or_else(|| Failure("an inner release freed the key".into()))?;
    ensure!(
        info.token == outer.token(),
        "the key changed hands after inner releases"
    );
    released(outer.release().await, "outermost release failed")?;
    ensure!(
        rival.inspect(&key).await?.is_none(),
        "outermost release did not free the key"
    );
    ensure!(owner.holds(&key) == 0, "owner still counts entries");
    let plain = client.lock(&key).await?;
    expect_kind(
        client.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "plain client locking twice",
    )?;
    plain.release().await?;
    Ok(())
}

/// Acquisitions dropped at random points (before the request, while the store applies it,
/// while the reply is on its way, while waiting) leave no hold: the key is free again long
/// before the TTL could have freed it.
pub async fn cancelled_acquire_leaves_nothing_held(ctx: &Ctx) -> Outcome {
    let key = ctx.key("cancel");
    let (client, faulty) = ctx.faulty_client().await?;
    let observer = ctx.client().await?;
    let reply_delay = Duration::from_millis(40);
    faulty.inject(Op::Acquire, Fault::ApplyThenDelayReply(reply_delay));
    for round in 0..12u64 {
        let cancel_after = Duration::from_millis(round * 5);
        if let Ok(Ok(guard)) =
            tokio::time::timeout(cancel_after, client.lock(&key).into_future()).await
        {
            guard.release().await?;
        }
        eventually(SLACK * 3, "a cancelled acquisition is released", || async {
            Ok(observer.inspect(&key).await?.is_none())
        })
        .await
        .map_err(|f| {
            Failure(format!(
                "round {round}, cancelled after {cancel_after:?}: {f}"
            ))
        })?;
    }
    faulty.heal();
    let holder = observer.lock(&key).await?;
    for round in 0..4u64 {
        let waiting = client.lock(&key).into_future();
        ensure!(
            tokio::time::timeout(Duration::from_millis(20 + round * 15), waiting)
                .await
                .is_err(),
            "a waiter got a held key"
        );
    }
    released(holder.release().await, "holder lost its lease")?;
    ensure!(
        observer.inspect(&key).await?.is_none(),
        "a cancelled waiter holds the key"
    );
    // A cancelled waiter cannot wait for its own clean-up: it leaves the queue from a
    // background task, which may still be on its way when the holder's release returns.
    eventually(SLACK, "cancelled waiters leave the store", || async {
        Ok(ctx.factory().residue(&key).await?.is_empty())
    })
    .await
    .map_err(|f| Failure(format!("cancelled acquisitions left state behind: {f}")))?;
    Ok(())
}

/// An acquisition abandoned before its request reached the store, which then applies it
/// after the first clean-up release, is released again: the key is free a request timeout
/// later, long before its TTL.
pub async fn late_landing_acquire_is_released(ctx: &Ctx) -> Outcome {
    let key = ctx.key("late-landing");
    let (client, faulty) = ctx.faulty_client().await?;
    let observer = ctx.client().await?;
    let request_timeout = Duration::from_millis(300);
    let options = AcquireOptions {
        request_timeout,
        wait: Wait::No,
        ..ctx.options()
    };
    faulty.inject_times(Op::Acquire, Fault::LandLate(Duration::from_millis(100)), 1);
    let abandoned = tokio::time::timeout(
        Duration::from_millis(10),
        client.lock(&key).options(options).into_future(),
    )
    .await;
    if let Ok(finished) = abandoned {
        let outcome = finished.map(|guard| guard.token());
        return Err(Failure(format!(
            "the slow acquisition finished before it was abandoned: {outcome:?}"
        )));
    }
    eventually(SLACK * 2, "the late request lands", || async {
        Ok(observer.inspect(&key).await?.is_some())
    })
    .await?;
    eventually(
        request_timeout + SLACK * 2,
        "the late grant is released",
        || async { Ok(observer.inspect(&key).await?.is_none()) },
    )
    .await?;
    let residue = ctx.factory().residue(&key).await?;
    ensure!(
        residue.is_empty(),
        "the late grant left state behind: {residue:?}"
    );
    Ok(())
}

/// An acquisition the store applied but whose reply was lost is retried to the same lease
/// and token, and only one hold exists.
pub async fn ambiguous_acquire_resolves_on_retry(ctx: &Ctx) -> Outcome {
    let key = ctx.key("ambiguous-acquire");
    let (client, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    faulty.inject_times(Op::Acquire, Fault::ApplyThenDropReply, 1);
    let guard = client.lock(&key).wait_up_to(Duration::from_secs(5)).await?;
    ensure!(
        faulty.calls(Op::Acquire) >= 2,
        "the lost reply was not retried"
    );
    let info = ctx
        .backend()
        .await?
        .inspect(&LockKey::new(&key)?)
        .await?
        .ok_or_else(|| Failure("the key is free".into()))?;
    ensure!(
        info.lease_id == guard.lease().id() && info.token == guard.token(),
        "the retry did not return the applied lease: store has {info:?}, guard {:?}",
        guard.lease()
    );
    expect_kind(
        rival.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "rival after an ambiguous acquire",
    )?;
    released(guard.release().await, "lease gone at release")?;
    ensure!(
        rival.inspect(&key).await?.is_none(),
        "an extra hold remains"
    );

    let backend = ctx.backend().await?;
    let ttl = ctx.long_ttl();
    let request = AcquireRequest::new(
        LockKey::new(&key)?,
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    );
    let first = backend.try_acquire(&request).await?.map(|g| g.token());
    let retry = backend.try_acquire(&request).await?.map(|g| g.token());
    ensure!(
        first.is_some() && first == retry,
        "a retried grant returned {retry:?} after {first:?}"
    );
    let _ = backend.release(request.key(), request.lease_id()).await?;
    Ok(())
}

/// A release the store applied but whose reply was lost is retried and reported as a
/// successful release of a held lease.
pub async fn ambiguous_release_resolves_on_retry(ctx: &Ctx) -> Outcome {
    let key = ctx.key("ambiguous-release");
    let (client, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    let guard = client.lock(&key).await?;
    let lease = guard.lease();
    faulty.inject_times(Op::Release, Fault::ApplyThenDropReply, 1);
    released(
        guard.release().await,
        "the release whose reply was lost reported the lease gone",
    )?;
    ensure!(
        faulty.calls(Op::Release) >= 2,
        "the lost reply was not retried"
    );
    ensure!(
        rival.inspect(&key).await?.is_none(),
        "the key is still held"
    );
    let again = faulty.release_lease(&lease, Duration::from_secs(5)).await?;
    ensure!(
        again == ReleaseOutcome::AlreadyReleased,
        "a further retry reported {again:?}"
    );
    Ok(())
}

/// While the store does not answer, a bounded acquisition fails within its bound with a
/// retryable "unavailable" error; once the store is back, locking works again.
pub async fn unavailable_store_is_retryable_and_recovers(ctx: &Ctx) -> Outcome {
    let key = ctx.key("unavailable");
    let (client, faulty) = ctx.faulty_client().await?;
    let bound = Duration::from_millis(500);
    // Silent for every acquisition request, a fair queue's enqueue included (a waiter
    // whose enqueue was answered knows the store is there: see
    // `queued_wait_times_out_while_its_attempt_is_slow`).
    faulty.inject(Op::Acquire, Fault::BlackHole);
    faulty.inject(Op::Queue, Fault::BlackHole);
    unavailable_within(bound, "silent store", client.lock(&key).wait_up_to(bound)).await?;
    faulty.heal();
    faulty.inject(Op::Acquire, Fault::Fail(ErrorKind::Unavailable));
    unavailable_within(Duration::ZERO, "failing store", client.try_lock(&key)).await?;
    faulty.heal();
    let guard = client.lock(&key).wait_up_to(Duration::from_secs(5)).await?;
    released(guard.release().await, "lease gone at release")?;
    Ok(())
}

/// A client of a store that cannot be reached fails with "unavailable" within the wait
/// bound, never hangs and never reports the key as held.
pub async fn unreachable_store_reports_unavailable(ctx: &Ctx) -> Outcome {
    let key = ctx.key("unreachable");
    let Some(connected) = ctx.factory().connect_unreachable().await else {
        return Err(Failure("the factory has no unreachable client".into()));
    };
    let backend = match connected {
        Ok(backend) => backend,
        Err(err) => {
            ensure!(
                err.kind() == ErrorKind::Unavailable,
                "connecting to nothing gave {err}"
            );
            return Ok(());
        }
    };
    let client = lock_core::LockClient::new(backend);
    let bound = Duration::from_secs(1);
    let options = AcquireOptions {
        wait: Wait::UpTo(bound),
        ..ctx.options()
    };
    unavailable_within(
        bound,
        "unreachable store",
        client.lock(&key).options(options),
    )
    .await?;
    Ok(())
}

/// A grant whose reply arrives after the lease's local deadline is never handed out: the
/// store may already have given the key to someone else. Waiting, the core retries with
/// the same lease id and hands out a live lease; not waiting, it reports "unavailable".
pub async fn stillborn_grant_is_never_handed_out(ctx: &Ctx) -> Outcome {
    let key = ctx.key("stillborn");
    let (client, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    let ttl = ctx.short_ttl();
    faulty.inject_times(Op::Acquire, Fault::ApplyThenDelayReply(ttl), 1);
    let guard = client
        .lock(&key)
        .ttl(ttl)
        .wait_up_to(Duration::from_secs(10))
        .await?;
    ensure!(
        guard.is_held() && guard.lease().is_valid(),
        "a grant that arrived after its deadline was handed out: {:?}",
        guard.lease()
    );
    ensure!(
        faulty.calls(Op::Acquire) >= 2,
        "the late grant was not retried"
    );
    expect_kind(
        rival.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "rival after the retried grant",
    )?;
    released(
        guard.release().await,
        "the retried lease was gone at release",
    )?;

    faulty.inject_times(Op::Acquire, Fault::ApplyThenDelayReply(ttl), 1);
    let not_waiting = client.lock(&key).ttl(ttl).no_wait().await;
    if let Ok(guard) = &not_waiting {
        return Err(Failure(format!(
            "a grant that arrived after its deadline was handed out without waiting: held {}",
            guard.is_held()
        )));
    }
    expect_kind(not_waiting, ErrorKind::Unavailable, "late grant, no wait")?;
    Ok(())
}

/// An attempt that went unanswered and lands after its retry succeeded and the lease was
/// released (a phantom hold of a lease id nobody holds) is released a request timeout
/// later, long before its TTL.
pub async fn phantom_hold_of_a_retried_acquire_is_released(ctx: &Ctx) -> Outcome {
    let key = ctx.key("phantom");
    let (client, faulty) = ctx.faulty_client().await?;
    let observer = ctx.client().await?;
    let request_timeout = Duration::from_millis(600);
    let landing = request_timeout + Duration::from_millis(100);
    let options = AcquireOptions {
        request_timeout,
        ..ctx.options()
    };
    faulty.inject_times(Op::Acquire, Fault::LandLate(landing), 1);
    let guard = client
        .lock(&key)
        .options(options)
        .wait_up_to(Duration::from_secs(10))
        .await?;
    released(guard.release().await, "lease gone at release")?;
    // Had the retry been slower than the late attempt, that attempt granted the lease
    // first and the release removed it; either way the key must end up free.
    eventually(
        landing + SLACK * 2,
        "the unanswered attempt lands",
        || async { Ok(faulty.landed() >= 1) },
    )
    .await?;
    eventually(
        request_timeout + SLACK * 2,
        "the phantom hold is released",
        || async { Ok(observer.inspect(&key).await?.is_none()) },
    )
    .await?;
    Ok(())
}

/// A release whose caller stops waiting for it still happens: the key is free long
/// before its TTL.
pub async fn cancelled_release_still_releases(ctx: &Ctx) -> Outcome {
    let key = ctx.key("cancelled-release");
    let (client, faulty) = ctx.faulty_client().await?;
    let observer = ctx.client().await?;
    let guard = client.lock(&key).await?;
    faulty.inject_times(Op::Release, Fault::Delay(Duration::from_millis(100)), 1);
    let cancelled = tokio::time::timeout(Duration::from_millis(10), guard.release()).await;
    ensure!(
        cancelled.is_err(),
        "the delayed release finished before it was cancelled"
    );
    eventually(SLACK * 2, "the cancelled release happens", || async {
        Ok(observer.inspect(&key).await?.is_none())
    })
    .await
}

/// While one task of a reentrant owner waits for a key held elsewhere, the owner's other
/// tasks are not held up: `try_lock` fails at once and a bounded wait keeps its bound.
/// When the waiter gets the key, the others re-enter it.
pub async fn owner_tasks_keep_their_own_bounds(ctx: &Ctx) -> Outcome {
    let key = ctx.key("owner-waits");
    let (client, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    let owner = client.owner();
    let held = rival.lock(&key).await?;
    let waiting = tokio::spawn({
        let (owner, key) = (owner.clone(), key.clone());
        async move { owner.lock(&key).await }
    });
    eventually(
        SLACK,
        "the owner's waiting task reaches the store",
        || async { Ok(faulty.calls(Op::Acquire) >= 1) },
    )
    .await?;
    let started = std::time::Instant::now();
    expect_kind(
        within(
            SLACK,
            "owner try_lock beside a waiting task",
            owner.try_lock(&key),
        )
        .await?,
        ErrorKind::HeldByAnother,
        "owner try_lock beside a waiting task",
    )?;
    let bound = Duration::from_millis(200);
    expect_kind(
        within(
            bound + SLACK,
            "owner bounded wait beside a waiting task",
            owner.lock(&key).wait_up_to(bound),
        )
        .await?,
        ErrorKind::TimedOut,
        "owner bounded wait beside a waiting task",
    )?;
    ensure!(
        started.elapsed() <= bound + SLACK * 2,
        "the owner's other tasks waited {:?}",
        started.elapsed()
    );
    released(held.release().await, "rival lost its lease")?;
    let guard = within(SLACK * 10, "the owner's waiting task", waiting)
        .await?
        .map_err(|e| Failure(format!("waiting task failed: {e}")))??;
    let again = within(SLACK, "re-entry", owner.try_lock(&key)).await??;
    ensure!(again.token() == guard.token(), "re-entry changed the token");
    again.release().await?;
    released(guard.release().await, "outermost release failed")?;
    ensure!(owner.holds(&key) == 0, "owner still counts entries");
    Ok(())
}
