//! Only the owner can release or renew; expired leases are lost, never resurrected.

use std::time::{Duration, Instant};

use lock_core::backend::{
    default_drift_allowance, AcquireRequest, DynBackend, LockBackendExt, Ownership, ReleaseOutcome,
};
use lock_core::{ErrorKind, Lease, LeaseId, LockKey, Renewal};

use crate::ensure;
use crate::harness::{eventually, expect_kind, Ctx, Failure, Outcome};

const TIMEOUT: Duration = Duration::from_secs(5);

async fn grant(backend: &DynBackend, key: &LockKey, ttl: Duration) -> Result<Lease, Failure> {
    let request = AcquireRequest::new(
        key.clone(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    );
    Ok(backend.acquire_once(&request, TIMEOUT).await?)
}

async fn holder(backend: &DynBackend, key: &LockKey) -> Result<Option<LeaseId>, Failure> {
    Ok(backend.inspect(key).await?.map(|info| info.lease_id))
}

/// Another client's release, with a lease id that is not the holder's, changes nothing.
pub async fn only_the_owner_releases(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("owner-release"))?;
    let (a, b) = (ctx.backend().await?, ctx.backend().await?);
    let lease = grant(&a, &key, ctx.long_ttl()).await?;
    ensure!(
        b.release(&key, LeaseId::random()).await? == Ownership::NotHeld,
        "a foreign lease id released the key"
    );
    let forged = AcquireRequest::new(key.clone(), ctx.long_ttl(), Duration::ZERO, Renewal::Manual)
        .grant(lease.token(), Instant::now());
    let outcome = b.release_lease(&forged, TIMEOUT).await?;
    ensure!(
        outcome == ReleaseOutcome::AlreadyReleased,
        "a forged lease's release reported {outcome:?}"
    );
    ensure!(
        holder(&b, &key).await? == Some(lease.id()),
        "the holder's lock did not survive a foreign release"
    );
    ensure!(
        a.release_lease(&lease, TIMEOUT).await? == ReleaseOutcome::Released,
        "the owner could not release"
    );
    Ok(())
}

/// Another client's renewal fails and neither extends nor changes the holder's lease.
pub async fn only_the_owner_renews(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("owner-renew"))?;
    let (a, b) = (ctx.backend().await?, ctx.backend().await?);
    let ttl = ctx.short_ttl() * 5;
    let lease = grant(&a, &key, ttl).await?;
    ensure!(
        b.renew(&key, LeaseId::random(), ctx.long_ttl()).await? == Ownership::NotHeld,
        "a foreign lease id renewed the key"
    );
    let info = b
        .inspect(&key)
        .await?
        .ok_or_else(|| Failure("the key became free".into()))?;
    ensure!(
        info.lease_id == lease.id() && info.token == lease.token(),
        "the holder changed: {info:?}"
    );
    ensure!(
        info.remaining_ttl <= ttl,
        "a foreign renewal extended the lease to {:?}",
        info.remaining_ttl
    );
    a.release_lease(&lease, TIMEOUT).await?;
    Ok(())
}

/// A lease that ran out is taken over with a greater token; the old holder's renew and
/// release then report lost and leave the new holder's lock intact.
pub async fn expiry_then_takeover(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("takeover"))?;
    let (a, b) = (ctx.backend().await?, ctx.backend().await?);
    let ttl = ctx.short_ttl();
    let old = grant(&a, &key, ttl).await?;
    let request = AcquireRequest::new(
        key.clone(),
        ctx.long_ttl(),
        default_drift_allowance(ctx.long_ttl()),
        Renewal::Manual,
    );
    let give_up = Instant::now() + ttl * 4;
    let (new, granted_by) = loop {
        match b.acquire_once(&request, TIMEOUT).await {
            Ok(lease) => break (lease, Instant::now()),
            Err(err) if err.kind() == ErrorKind::HeldByAnother && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(err) => return Err(Failure(format!("takeover after expiry failed: {err}"))),
        }
    };
    // The store may only hand the key over once the old TTL has run out (5 ms for a
    // remote store's clock ticking differently).
    ensure!(
        granted_by + Duration::from_millis(5) >= old.sent_at() + ttl,
        "the key was taken over {:?} after the old grant was sent, before its TTL of {ttl:?}",
        granted_by - old.sent_at()
    );
    ensure!(
        new.token() > old.token(),
        "takeover token {} is not above {}",
        new.token(),
        old.token()
    );
    expect_kind(
        a.renew_lease(&old, ttl, TIMEOUT).await,
        ErrorKind::Lost,
        "renewing the expired lease",
    )?;
    expect_kind(
        a.release_lease(&old, TIMEOUT).await,
        ErrorKind::Lost,
        "releasing the expired lease",
    )?;
    ensure!(
        holder(&a, &key).await? == Some(new.id()),
        "the old holder's calls disturbed the new lock"
    );
    ensure!(
        b.release_lease(&new, TIMEOUT).await? == ReleaseOutcome::Released,
        "the new holder could not release"
    );
    Ok(())
}

/// Renewing or releasing an expired lease is lost even when nobody took the key since,
/// and the renewal does not bring the lease back.
pub async fn expired_lease_is_lost_even_if_untaken(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("expired-untaken"))?;
    let a = ctx.backend().await?;
    let ttl = ctx.short_ttl();
    let lease = grant(&a, &key, ttl).await?;
    eventually(ttl * 4, "lease expires", || async {
        Ok(holder(&a, &key).await?.is_none())
    })
    .await?;
    expect_kind(
        a.renew_lease(&lease, ttl, TIMEOUT).await,
        ErrorKind::Lost,
        "renewing after expiry",
    )?;
    ensure!(
        holder(&a, &key).await?.is_none(),
        "renewal brought an expired lease back"
    );
    expect_kind(
        a.release_lease(&lease, TIMEOUT).await,
        ErrorKind::Lost,
        "releasing after expiry",
    )?;
    Ok(())
}

/// A second release of the same lease reports "already released" and never removes the
/// lock another owner took in between.
pub async fn release_is_idempotent(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("release-twice"))?;
    let (a, b) = (ctx.backend().await?, ctx.backend().await?);
    let first = grant(&a, &key, ctx.long_ttl()).await?;
    ensure!(
        a.release_lease(&first, TIMEOUT).await? == ReleaseOutcome::Released,
        "first release failed"
    );
    ensure!(
        a.release_lease(&first, TIMEOUT).await? == ReleaseOutcome::AlreadyReleased,
        "second release was not reported as already released"
    );
    let second = grant(&b, &key, ctx.long_ttl()).await?;
    ensure!(
        a.release_lease(&first, TIMEOUT).await? == ReleaseOutcome::AlreadyReleased,
        "a stale release was not reported as already released"
    );
    ensure!(
        holder(&b, &key).await? == Some(second.id()),
        "a stale release removed another owner's lock"
    );
    b.release_lease(&second, TIMEOUT).await?;
    Ok(())
}
