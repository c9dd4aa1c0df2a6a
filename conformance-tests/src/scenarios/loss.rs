//! Loss a holder can act on: why a lock was lost, a warning before it is, a cap on how
//! long renewal keeps it, a session the store ends, and a client shutdown that gives
//! every lock back at once.

use std::time::Instant;

use lock_core::{ErrorKind, LeaseHealth, LossReason};

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{eventually, expect_kind, released, within, Ctx, Outcome, SLACK};

/// Failing renewals turn the guard [`LeaseHealth::Suspended`] while the lease is still
/// held, answered ones make it `Healthy` again, and when the deadline passes without a
/// renewal `lost()` says so ([`LossReason::DeadlinePassed`]).
pub async fn failing_renewals_warn_before_the_loss(ctx: &Ctx) -> Outcome {
    let key = ctx.key("renewal-trouble");
    // Long enough that a healed store is renewing again well before the deadline.
    let ttl = ctx.short_ttl() * 5;
    let (holder, faulty) = ctx.faulty_client().await?;
    let guard = holder.lock(&key).ttl(ttl).await?;
    ensure!(
        guard.health() == LeaseHealth::Healthy,
        "a fresh lease is {:?}",
        guard.health()
    );
    faulty.inject(Op::Renew, Fault::Fail(ErrorKind::Unavailable));
    let warned = within(ttl, "a warning once renewals fail", guard.renewal_trouble()).await?;
    let deadline = guard.lease().valid_until();
    ensure!(
        warned == LeaseHealth::Suspended,
        "the first trouble was {warned:?}, not Suspended"
    );
    ensure!(Instant::now() < deadline, "warned only after the deadline");
    ensure!(
        guard.loss_reason().is_none(),
        "a suspended lease has a loss reason"
    );
    faulty.heal();
    let healed = within(
        ttl / 2,
        "healthy again once renewals are answered",
        guard.health_changed(LeaseHealth::Suspended),
    )
    .await?;
    ensure!(
        healed == LeaseHealth::Healthy,
        "after the store healed the lease is {healed:?}"
    );
    faulty.inject(Op::Renew, Fault::Fail(ErrorKind::Unavailable));
    let reason = within(
        ttl + SLACK,
        "lost() once renewals fail for good",
        guard.lost(),
    )
    .await?;
    ensure!(
        reason == LossReason::DeadlinePassed,
        "lost for {reason:?}, not DeadlinePassed"
    );
    ensure!(
        guard.loss_reason() == Some(LossReason::DeadlinePassed),
        "loss_reason() is {:?} after lost()",
        guard.loss_reason()
    );
    faulty.heal();
    expect_kind(
        guard.release().await,
        ErrorKind::Lost,
        "releasing a lost lease",
    )?;
    Ok(())
}

/// A lease the store no longer has (an operator broke the lock) is lost at its next
/// renewal with [`LossReason::NotHeld`].
pub async fn broken_lease_is_lost_as_not_held(ctx: &Ctx) -> Outcome {
    let key = ctx.key("not-held");
    let ttl = ctx.short_ttl();
    let (holder, operator) = (ctx.client().await?, ctx.client().await?);
    let guard = holder.lock(&key).ttl(ttl).await?;
    operator.break_lock(&key, guard.token()).await?;
    let reason = within(
        ttl + SLACK,
        "lost() after the lock was broken",
        guard.lost(),
    )
    .await?;
    ensure!(
        reason == LossReason::NotHeld,
        "lost for {reason:?}, not NotHeld"
    );
    Ok(())
}

/// `max_hold` ends an automatically renewed hold at its cap, never before:
/// `lost()` says [`LossReason::HoldCapReached`], and the key is given back then, not left
/// to expire with the TTL.
pub async fn max_hold_ends_the_hold_and_frees_the_key(ctx: &Ctx) -> Outcome {
    let key = ctx.key("max-hold");
    // Renewed twice before the cap; its last renewal would keep it 2/3 TTL past the cap,
    // far more than SLACK, so a free key within SLACK of the loss was given back.
    let ttl = ctx.short_ttl() * 3;
    let cap = ttl;
    let (holder, rival) = (ctx.client().await?, ctx.client().await?);
    let asked = Instant::now();
    let guard = holder.lock(&key).ttl(ttl).max_hold(cap).await?;
    let reason = within(cap + SLACK, "lost() at the hold cap", guard.lost()).await?;
    let lost_at = Instant::now();
    ensure!(
        reason == LossReason::HoldCapReached,
        "lost for {reason:?}, not HoldCapReached"
    );
    ensure!(
        lost_at >= asked + cap,
        "the hold ended {:?} before its cap",
        asked + cap - lost_at
    );
    eventually(SLACK, "the key free once the cap was reached", || async {
        match rival.try_lock(&key).await {
            Ok(taken) => {
                taken.release().await?;
                Ok(true)
            }
            Err(err) if err.kind() == ErrorKind::HeldByAnother => Ok(false),
            Err(err) => Err(err.into()),
        }
    })
    .await?;
    expect_kind(
        guard.release().await,
        ErrorKind::Lost,
        "releasing a hold ended by its cap",
    )?;
    Ok(())
}

/// `shutdown()` gives back every lease the client holds, although their guards are
/// still alive: a rival gets each key at once, not after the TTL. The guards then answer
/// as released, and the client acquires nothing more.
pub async fn shutdown_frees_every_key_at_once(ctx: &Ctx) -> Outcome {
    let keys: Vec<String> = (0..3).map(|i| ctx.key(&format!("shutdown-{i}"))).collect();
    let (holder, rival) = (ctx.client().await?, ctx.client().await?);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.lock(key).ttl(ctx.long_ttl()).await?);
    }
    holder.shutdown().await?;
    for key in &keys {
        let taken = rival
            .try_lock(key)
            .await
            .map_err(|err| crate::Failure(format!("{key:?} still held after shutdown: {err}")))?;
        released(taken.release().await, "the rival's lease after shutdown")?;
    }
    for guard in guards {
        ensure!(!guard.is_held(), "a guard is held after shutdown");
        released(guard.release().await, "a guard released after shutdown")?;
    }
    expect_kind(
        holder.try_lock(&keys[0]).await,
        ErrorKind::InvalidInput,
        "an acquisition after shutdown",
    )?;
    Ok(())
}

/// A session that loses its link turns its leases [`LeaseHealth::Suspended`] before
/// they are lost.
pub async fn cut_session_link_warns_before_the_loss(ctx: &Ctx) -> Outcome {
    let key = ctx.key("session-trouble");
    let ttl = ctx.short_ttl() * 5;
    let (holder, link) = ctx.linked_client().await?;
    let guard = holder.lock(&key).ttl(ttl).await?;
    link.cut();
    let warned = within(
        ttl * 2,
        "a warning once the link is cut",
        guard.renewal_trouble(),
    )
    .await;
    link.restore();
    let warned = warned?;
    ensure!(
        warned == LeaseHealth::Suspended,
        "the first trouble was {warned:?}, not Suspended"
    );
    // Lost or kept meanwhile: either is right once the warning came first.
    drop(guard.release().await);
    Ok(())
}

/// A session the store ends while the holder's link is healthy (etcd revoking its lease)
/// loses its lease with [`LossReason::SessionEnded`], at its next keep-alive, well before
/// the local deadline (so not by a time-out in disguise). The store frees the key at
/// once, before the holder can hear of it: no client can learn earlier than its next
/// keep-alive, so what the holder does meanwhile is fenced out by the rival's greater
/// token, as after an operator's `break_lock`.
pub async fn session_ended_by_the_store_is_lost_as_session_ended(ctx: &Ctx) -> Outcome {
    let key = ctx.key("session-ended");
    // Keep-alives every third of it: one comes long before the deadline.
    let ttl = ctx.short_ttl() * 5;
    let ender = ctx
        .factory()
        .session_ender()
        .ok_or_else(|| crate::Failure("the factory cannot end a session".into()))?;
    let (holder, rival) = (ctx.client().await?, ctx.client().await?);
    let guard = holder.lock(&key).ttl(ttl).await?;
    ender.end_session_holding(&key).await?;
    let ended = Instant::now();
    let deadline = guard.lease().valid_until();
    let reason = within(
        ttl,
        "lost() after the store ended the session",
        guard.lost(),
    )
    .await?;
    ensure!(
        reason == LossReason::SessionEnded,
        "lost for {reason:?}, not SessionEnded"
    );
    ensure!(
        Instant::now() < deadline,
        "lost only at the local deadline, {:?} after the session ended",
        ended.elapsed()
    );
    ensure!(
        guard.loss_reason() == Some(LossReason::SessionEnded),
        "loss_reason() is {:?} after lost()",
        guard.loss_reason()
    );
    let taken = rival.lock(&key).wait_up_to(SLACK).await.map_err(|err| {
        crate::Failure(format!(
            "the key is still held after its session ended: {err}"
        ))
    })?;
    ensure!(
        taken.token() > guard.token(),
        "the next holder's token {} is not above {}",
        taken.token(),
        guard.token()
    );
    released(taken.release().await, "the rival's lease")?;
    expect_kind(
        guard.release().await,
        ErrorKind::Lost,
        "releasing a lease whose session ended",
    )?;
    Ok(())
}
