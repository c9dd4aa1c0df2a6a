//! Session-bound backends ([`Liveness::Session`](lock_core::Liveness)): leases that live
//! by one keep-alive per session follow it, and the holder still learns it lost a lock
//! before anyone else can take it.

use std::time::{Duration, Instant};

use lock_core::{AcquireOptions, Backoff, LockGuard, Wait};

use crate::ensure;
use crate::harness::{
    eventually, granted_within, released, spawn_lock, within, Ctx, LinkControl, Outcome, SLACK,
};

/// When the holder's link is cut, the store ends its session once the TTL runs out. Every
/// lease of that session is lost together, at a deadline no later than the first rival's
/// grant; once the link is back, the client acquires under a new session that its
/// keep-alives keep alive.
pub async fn session_expiry_loses_every_lease_before_a_rival_is_granted(ctx: &Ctx) -> Outcome {
    let ttl = ctx.short_ttl();
    let (holder, link) = ctx.linked_client().await?;
    let keys: Vec<String> = (0..3)
        .map(|i| ctx.key(&format!("session-expiry-{i}")))
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.lock(key).ttl(ttl).await?);
    }
    kept_alive_once(&guards[0], ttl).await?;
    takeover_after_cut(ctx, &guards, &keys, link.as_ref(), ttl).await?;
    let deadlines: Vec<Instant> = guards.iter().map(|g| g.lease().valid_until()).collect();
    ensure!(
        deadlines.windows(2).all(|pair| pair[0] == pair[1]),
        "the leases of one session ended at different deadlines: {deadlines:?}"
    );
    link.restore();
    let again = holder.lock(&keys[0]).ttl(ttl).wait_up_to(ttl * 4).await?;
    ensure!(
        again.token() > guards[0].token(),
        "the new acquisition did not get a newer token"
    );
    // The new session's keep-alives carry the lease across several TTLs.
    tokio::time::sleep(ttl * 3).await;
    ensure!(
        again.is_held(),
        "a lease of the new session was not kept alive"
    );
    released(
        again.release().await,
        "lease of the new session gone at release",
    )?;
    Ok(())
}

/// A disconnected session stops extending deadlines: the lease is lost no later than a
/// TTL after the last keep-alive sent before the cut.
pub async fn disconnected_session_stops_extending_the_deadline(ctx: &Ctx) -> Outcome {
    let ttl = ctx.short_ttl();
    let key = ctx.key("session-disconnected");
    let (holder, link) = ctx.linked_client().await?;
    let guard = holder.lock(&key).ttl(ttl).await?;
    kept_alive_once(&guard, ttl).await?;
    link.cut();
    let cut_at = Instant::now();
    within(ttl + SLACK, "lost() after the link was cut", guard.lost()).await?;
    let lease = guard.lease();
    ensure!(
        lease.sent_at() <= cut_at,
        "the deadline moved on a keep-alive sent {:?} after the link was cut",
        lease.sent_at() - cut_at
    );
    ensure!(
        lease.valid_until() <= cut_at + ttl,
        "the deadline is later than a TTL after the cut"
    );
    ensure!(!guard.is_held(), "is_held() after lost()");
    link.restore();
    let rival = ctx.client().await?;
    let taken = rival.lock(&key).ttl(ttl).wait_up_to(ttl * 4).await?;
    released(taken.release().await, "rival lost its lease")?;
    Ok(())
}

/// A keep-alive proves the session alive from when it was *sent*: with slow replies, a
/// deadline measured from the reply would outlast the store's expiry, and a rival would
/// get the key while the holder still trusts its lease.
pub async fn keep_alive_is_measured_from_its_send(ctx: &Ctx) -> Outcome {
    let ttl = ctx.short_ttl();
    let key = ctx.key("session-slow-replies");
    let (holder, link) = ctx.linked_client().await?;
    // Far more than the drift allowance, well under a keep-alive interval.
    link.delay_replies(ttl / 4);
    let guard = holder.lock(&key).ttl(ttl).await?;
    kept_alive_once(&guard, ttl * 2).await?;
    takeover_after_cut(
        ctx,
        std::slice::from_ref(&guard),
        std::slice::from_ref(&key),
        link.as_ref(),
        ttl,
    )
    .await
}

/// Waits until a keep-alive has moved the lease's deadline past its grant's.
async fn kept_alive_once(guard: &LockGuard, within_time: Duration) -> Outcome {
    let granted = guard.lease().sent_at();
    eventually(
        within_time * 2,
        "a keep-alive moved the deadline",
        || async { Ok(guard.lease().sent_at() > granted) },
    )
    .await
}

/// Cuts the holder's link and has a rival wait for every key: each holder's deadline (what
/// `lost()` fires on) must come no later than the rival's grant, and `lost()` must fire.
async fn takeover_after_cut(
    ctx: &Ctx,
    guards: &[LockGuard],
    keys: &[String],
    link: &dyn LinkControl,
    ttl: Duration,
) -> Outcome {
    link.cut();
    let mut rivals = Vec::new();
    for key in keys {
        // Polls fast, so its grant is seen within a few milliseconds of the store's.
        let options = AcquireOptions {
            wait: Wait::UpTo(ttl * 6),
            backoff: Backoff {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(5),
            },
            ..ctx.options()
        };
        rivals.push(spawn_lock(ctx.client().await?, key, options));
    }
    for guard in guards {
        within(ttl * 3, "lost() after the link was cut", guard.lost()).await?;
    }
    for (guard, rival) in guards.iter().zip(rivals) {
        let (rival_guard, got_at) = granted_within(ttl * 7, "rival", rival).await?;
        let deadline = guard.lease().valid_until();
        ensure!(
            deadline <= got_at,
            "a rival got {:?} {:?} before the holder's deadline",
            guard.key().as_str(),
            deadline - got_at
        );
        ensure!(!guard.is_held(), "is_held() after the session ended");
        released(rival_guard.release().await, "rival lost its lease")?;
    }
    Ok(())
}
