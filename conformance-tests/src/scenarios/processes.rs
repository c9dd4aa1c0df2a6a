//! Holders in other processes: what a process that dies without a word (SIGKILL: no
//! release, no clean-up, its connections cut by the kernel) leaves to the others.

use std::time::{Duration, Instant};

use lock_core::{AcquireOptions, Backoff, ErrorKind, LockKey, Wait};

use crate::ensure;
use crate::harness::{
    eventually, expect_kind, granted_within, released, spawn_lock, Ctx, Failure, Outcome, SLACK,
};
use crate::holder_process::HolderProcess;

/// How long a holder process may take to start, connect and lock.
const HOLDER_START: Duration = Duration::from_secs(30);

/// A holder process killed with SIGKILL cannot release: the store frees the key on its
/// own, no later than the TTL after the kill (plus lateness), and a waiter in another
/// process, queued or polling since before the kill, gets it then, with a greater token,
/// and not before the kill: the holder's renewals kept it while it lived.
pub async fn killed_holder_process_hands_over_to_a_waiter(ctx: &Ctx) -> Outcome {
    let url = ctx
        .factory()
        .process_url()
        .ok_or_else(|| Failure("no other process can reach the store".into()))?;
    let key = ctx.key("killed-holder");
    let ttl = ctx.short_ttl();
    let mut holder = HolderProcess::start(&url, &key, ttl)?;
    let held = holder.held(HOLDER_START).await?;
    let waiter = ctx.client().await?;
    expect_kind(
        waiter.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "a try while another process holds the key",
    )?;
    let options = AcquireOptions {
        ttl,
        wait: Wait::UpTo(ttl * 10),
        // Polls fast where the store does not notify, so the grant is seen within
        // milliseconds of the key being free.
        backoff: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(10),
        },
        ..ctx.options()
    };
    let waiting = spawn_lock(waiter, &key, options);
    if ctx.capabilities().fair_ordering {
        let observer = ctx.backend().await?;
        let lock_key = LockKey::new(&key)?;
        eventually(Duration::from_secs(10), "the waiter queues", || async {
            let info = observer.inspect(&lock_key).await?;
            Ok(info.and_then(|info| info.waiters) == Some(1))
        })
        .await?;
    }
    let killed_at = Instant::now();
    holder.kill()?;
    // SLACK for timers and scheduling, once more for a store that ends expired leases in
    // periodic sweeps (etcd's lessor every 500 ms, ZooKeeper's session ticks) and once
    // more for a notification or a poll to reach the waiter.
    let bound = ctx.capabilities().store_ttl(ttl) + SLACK * 3;
    let (guard, got_at) =
        granted_within(bound + ttl, "the waiter after the holder's kill", waiting).await?;
    let after = got_at.checked_duration_since(killed_at).ok_or_else(|| {
        Failure(format!(
            "the waiter got the key {:?} before its holder process was killed",
            killed_at - got_at
        ))
    })?;
    ensure!(
        after <= bound,
        "the key was free only {after:?} after the holder process was killed (TTL {ttl:?}, bound {bound:?})"
    );
    ensure!(
        guard.token().get() > held,
        "the waiter's token {} is not above the killed holder's {held}",
        guard.token()
    );
    released(guard.release().await, "the waiter lost the key")
}
