//! Renewal: it keeps a lock, stops with the guard, and signals loss in time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{AcquireOptions, ErrorKind, Renewal, Wait};

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::released;
use crate::harness::{
    eventually, expect_kind, granted_within, spawn_lock, within, Ctx, Failure, Outcome, SLACK,
};

/// Automatic renewal keeps a short-TTL lock for ten TTLs; nobody else gets it meanwhile.
pub async fn renewal_keeps_lock_across_ten_ttls(ctx: &Ctx) -> Outcome {
    let key = ctx.key("renewal");
    let ttl = ctx.short_ttl();
    let (holder, rival) = (ctx.client().await?, ctx.client().await?);
    let guard = holder.lock(&key).ttl(ttl).await?;
    let lost = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (lost, signal) = (lost.clone(), guard.lost());
        tokio::spawn(async move {
            signal.await;
            lost.store(true, Ordering::SeqCst);
        })
    };
    let until = Instant::now() + ttl * 10;
    while Instant::now() < until {
        expect_kind(
            rival.try_lock(&key).await,
            ErrorKind::HeldByAnother,
            "rival try-lock while renewed",
        )?;
        ensure!(guard.is_held(), "the renewed lease is not held");
        tokio::time::sleep(ttl / 4).await;
    }
    let info = rival
        .inspect(&key)
        .await?
        .ok_or_else(|| Failure("the key is free".into()))?;
    ensure!(
        info.token == guard.token(),
        "the token changed while renewing"
    );
    ensure!(
        !lost.load(Ordering::SeqCst),
        "lost() fired for a renewed lease"
    );
    released(
        guard.release().await,
        "the renewed lease was gone at release",
    )?;
    watcher.abort();
    Ok(())
}

/// After release, and after drop, no renewal is sent.
pub async fn no_zombie_renewal_after_release(ctx: &Ctx) -> Outcome {
    let ttl = ctx.short_ttl();
    let (client, faulty) = ctx.faulty_client().await?;
    for dropped in [false, true] {
        let key = ctx.key(if dropped {
            "zombie-drop"
        } else {
            "zombie-release"
        });
        let guard = client.lock(&key).ttl(ttl).await?;
        let before = faulty.calls(Op::Renew);
        eventually(ttl * 2, "the lease is renewed", || async {
            Ok(faulty.calls(Op::Renew) > before)
        })
        .await?;
        if dropped {
            drop(guard);
            eventually(
                ttl,
                "dropped guard is released in the background",
                || async { Ok(client.inspect(&key).await?.is_none()) },
            )
            .await?;
        } else {
            released(guard.release().await, "lease gone at release")?;
        }
        let after = faulty.calls(Op::Renew);
        tokio::time::sleep(ttl * 2).await; // the watch window itself: renewals would happen at ttl/3
        let later = faulty.calls(Op::Renew);
        ensure!(
            later == after,
            "{} renewals after the guard was {}",
            later - after,
            if dropped { "dropped" } else { "released" }
        );
    }
    Ok(())
}

/// When renewals stop reaching the store, the holder's `lost()` fires no later than TTL
/// after the last successful renewal was sent, and before anyone else gets the key.
pub async fn lost_signal_precedes_takeover(ctx: &Ctx) -> Outcome {
    let key = ctx.key("lost-signal");
    let ttl = ctx.short_ttl();
    let (holder, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    let guard = holder.lock(&key).ttl(ttl).await?;
    let renewals = faulty.calls(Op::Renew);
    eventually(ttl * 2, "a first renewal", || async {
        Ok(faulty.calls(Op::Renew) > renewals)
    })
    .await?;
    faulty.inject(Op::Renew, Fault::BlackHole);
    faulty.inject(Op::Release, Fault::BlackHole);
    let rival_wait = spawn_lock(
        rival,
        &key,
        AcquireOptions {
            wait: Wait::UpTo(ttl * 6),
            ..ctx.options()
        },
    );
    within(ttl * 3, "lost() after renewals stopped", guard.lost()).await?;
    let lost_at = Instant::now();
    let (rival_guard, rival_got_it) = granted_within(ttl * 7, "rival", rival_wait).await?;
    let last = guard.lease();
    // The holder's deadline is what lost() fires on; the comparison with the rival's grant
    // does not depend on how promptly this task is scheduled.
    ensure!(
        last.valid_until() <= rival_got_it,
        "the rival got the key {:?} before the holder's deadline",
        last.valid_until() - rival_got_it
    );
    ensure!(
        last.valid_until() <= last.sent_at() + ttl,
        "the holder's deadline is later than TTL after the last renewal was sent"
    );
    ensure!(
        lost_at <= last.valid_until() + SLACK,
        "lost() fired {:?} after the holder's deadline",
        lost_at - last.valid_until()
    );
    rival_guard.release().await?;
    ensure!(!guard.is_held(), "is_held() is true after lost()");
    expect_kind(
        guard.renew().await,
        ErrorKind::Lost,
        "renewing a lost lease",
    )?;
    expect_kind(
        guard.release().await,
        ErrorKind::Lost,
        "a lost lease was reported held at release",
    )?;
    Ok(())
}

/// Manual renewal extends the lease; without it the lease is lost at its deadline.
pub async fn manual_renewal_extends_then_expires(ctx: &Ctx) -> Outcome {
    let key = ctx.key("manual");
    let ttl = ctx.short_ttl();
    let client = ctx.client().await?;
    let guard = client.lock(&key).ttl(ttl).renewal(Renewal::Manual).await?;
    for _ in 0..3 {
        tokio::time::sleep(ttl / 2).await;
        guard.renew().await?;
        ensure!(guard.is_held(), "not held right after a manual renewal");
    }
    let last_sent = guard.lease().sent_at();
    within(
        ttl + SLACK,
        "lost() once manual renewals stop",
        guard.lost(),
    )
    .await?;
    ensure!(
        Instant::now()
            >= last_sent + ttl - guard.lease().drift_allowance() - Duration::from_millis(1),
        "lost() fired before the deadline"
    );
    expect_kind(
        guard.renew().await,
        ErrorKind::Lost,
        "renewing after the deadline",
    )?;
    expect_kind(
        guard.release().await,
        ErrorKind::Lost,
        "an expired lease was reported held at release",
    )?;
    Ok(())
}
