//! The lock patterns built on the mutex: once-per-window tickets, scoped locking that stops
//! its body at loss, and in-process coalescing of a client's waiting tasks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::lock_unpoisoned;
use lock_core::{ErrorKind, LeaseSharing, LockClient, LockScope, OnceTicket};

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{eventually, expect_kind, released, within, Ctx, LinkControl, Outcome, SLACK};

/// A ticket finished early keeps the key taken until `at_least` after the start, by the
/// store's clock: no replica gets it sooner, and one gets it soon after.
pub async fn once_window_holds_for_at_least(ctx: &Ctx) -> Outcome {
    let key = ctx.key("once-at-least");
    let at_least = ctx.short_ttl() * 2;
    let (first, second) = (ctx.client().await?, ctx.client().await?);
    let started = Instant::now();
    let ticket = first
        .once(&key)
        .at_least(at_least)
        .at_most(ctx.long_ttl())
        .await?;
    let Some(ticket) = ticket else {
        return Err(crate::Failure("a free key gave no once ticket".into()));
    };
    ticket.finish().await?;
    ensure!(
        second.once(&key).await?.is_none(),
        "a second replica got the key right after the first finished early"
    );
    let ticket = ticket_within(ctx, &second, &key, at_least + SLACK * 2).await?;
    let taken_at = started.elapsed();
    ticket.finish().await?;
    ensure!(
        taken_at >= at_least,
        "the key was free {taken_at:?} after the start, before at_least {at_least:?}"
    );
    Ok(())
}

/// A ticket dropped without finishing (a crashed job) keeps the key until `at_most` after
/// the start, then the key frees itself.
pub async fn once_window_frees_at_at_most_after_a_crash(ctx: &Ctx) -> Outcome {
    let key = ctx.key("once-at-most");
    let at_most = ctx.short_ttl();
    let (first, second) = (ctx.client().await?, ctx.client().await?);
    let started = Instant::now();
    let ticket = first.once(&key).at_most(at_most).await?;
    ensure!(ticket.is_some(), "a free key gave no once ticket");
    drop(ticket);
    ensure!(
        second.once(&key).await?.is_none(),
        "a dropped ticket freed the key before at_most"
    );
    let ticket = ticket_within(ctx, &second, &key, at_most + SLACK * 2).await?;
    let taken_at = started.elapsed();
    ticket.finish().await?;
    ensure!(
        taken_at >= at_most,
        "the key was free {taken_at:?} after the start, before at_most {at_most:?}"
    );
    Ok(())
}

/// A ticket's hold outlives the client that took it: a client that shuts down (ending
/// its sessions, on a session store) while its job runs, or whose process ends, leaves
/// the key taken until `at_most` after the start, and not longer.
pub async fn once_window_outlives_its_client(ctx: &Ctx) -> Outcome {
    let key = ctx.key("once-outlives");
    let at_most = ctx.short_ttl() * 2;
    let (first, second) = (ctx.client().await?, ctx.client().await?);
    let started = Instant::now();
    let Some(ticket) = first.once(&key).at_most(at_most).await? else {
        return Err(crate::Failure("a free key gave no once ticket".into()));
    };
    first.shutdown().await?;
    drop((ticket, first));
    ensure!(
        second.once(&key).await?.is_none(),
        "the key was free once the ticket's client shut down, before at_most"
    );
    let ticket = ticket_within(ctx, &second, &key, at_most + SLACK * 2).await?;
    let taken_at = started.elapsed();
    ticket.finish().await?;
    ensure!(
        taken_at >= at_most,
        "the key was free {taken_at:?} after the start, before at_most {at_most:?}"
    );
    Ok(())
}

/// A ticket is never renewed: its hold runs out at `at_most` with no renewal sent, the
/// holder learns it, and finishing afterwards reports the loss.
pub async fn once_ticket_never_renews(ctx: &Ctx) -> Outcome {
    let key = ctx.key("once-no-renewal");
    let at_most = ctx.short_ttl();
    let (client, faulty) = ctx.faulty_client().await?;
    let Some(ticket) = client.once(&key).at_most(at_most).await? else {
        return Err(crate::Failure("a free key gave no once ticket".into()));
    };
    within(
        at_most + SLACK,
        "the ticket's hold to run out",
        ticket.lost(),
    )
    .await?;
    ensure!(
        faulty.calls(Op::Renew) == 0,
        "a once ticket was renewed {} times",
        faulty.calls(Op::Renew)
    );
    let rival = ctx.client().await?;
    let taken = ticket_within(ctx, &rival, &key, SLACK * 2).await?;
    expect_kind(
        ticket.finish().await,
        ErrorKind::Lost,
        "finishing a ticket whose hold ran out",
    )?;
    taken.finish().await?;
    Ok(())
}

/// The first once ticket `client` gets for `key`, trying until `limit` passes.
async fn ticket_within(
    ctx: &Ctx,
    client: &LockClient,
    key: &str,
    limit: Duration,
) -> Result<OnceTicket, crate::Failure> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(ticket) = client.once(key).at_most(ctx.long_ttl()).await? {
            return Ok(ticket);
        }
        if Instant::now() >= deadline {
            return Err(crate::Failure(format!(
                "no once ticket for the key within {limit:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `at_least` longer than `at_most` is refused before the store is asked.
pub async fn once_window_bounds_are_checked(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    expect_kind(
        client
            .once(ctx.key("once-bounds"))
            .at_least(Duration::from_secs(10))
            .at_most(Duration::from_secs(5))
            .await,
        ErrorKind::InvalidInput,
        "at_least longer than at_most",
    )?;
    ensure!(
        faulty.total_calls() == 0,
        "invalid once bounds reached the store"
    );
    Ok(())
}

/// A session-bound store cannot keep a hold without its session, nor shorten one: a once
/// request is refused as unsupported, touching nothing.
pub async fn once_window_is_refused_on_a_session_store(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    expect_kind(
        client.once(ctx.key("once-session")).await,
        ErrorKind::Unsupported,
        "a once ticket on a session-bound store",
    )?;
    ensure!(
        faulty.total_calls() == 0,
        "the refused once request reached the store"
    );
    Ok(())
}

/// `with_lock` returns the body's value and gives the key back.
pub async fn with_lock_returns_the_body_value_and_releases(ctx: &Ctx) -> Outcome {
    let key = ctx.key("scoped-value");
    let client = ctx.client().await?;
    let token = client
        .with_lock(&key, |scope| async move { scope.token() })
        .await?;
    let next = ctx.client().await?.try_lock(&key).await?;
    ensure!(
        next.token() > token,
        "the next holder's token {} is not above the scoped holder's {token}",
        next.token()
    );
    released(next.release().await, "next holder")?;
    Ok(())
}

/// Loss by failing renewals: the body of `with_lock` is stopped before a rival is granted.
pub async fn with_lock_stops_its_body_when_renewals_fail(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    let cut = move || faulty.inject(Op::Renew, Fault::Fail(ErrorKind::Unavailable));
    body_stopped_before_rival(ctx, client, cut).await
}

/// Loss by a cut session link: the body of `with_lock` is stopped before a rival is
/// granted.
pub async fn with_lock_stops_its_body_when_the_session_ends(ctx: &Ctx) -> Outcome {
    let (client, link): (LockClient, Arc<dyn LinkControl>) = ctx.linked_client().await?;
    let cut = move || link.cut();
    body_stopped_before_rival(ctx, client, cut).await
}

/// Runs a never-ending body under `with_lock` on `client`, makes the lease be lost with
/// `cut`, and checks what the contract promises: the lease's local deadline (where the
/// holder stops trusting it, and the loss signal fires) came before a rival client was
/// granted the key, the body was dropped promptly after that deadline (a best-effort stop
/// at its next await point: a timer on a loaded machine may fire a few milliseconds
/// late), and the call failed with `Lost`.
async fn body_stopped_before_rival(
    ctx: &Ctx,
    client: LockClient,
    cut: impl FnOnce() + Send,
) -> Outcome {
    let key = ctx.key("scoped-loss");
    let ttl = ctx.short_ttl();
    let started = Arc::new(AtomicBool::new(false));
    let stopped: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::default();
    let scoped = {
        let (key, started, stopped) = (key.clone(), started.clone(), stopped.clone());
        tokio::spawn(async move {
            client
                .lock(&key)
                .ttl(ttl)
                .scoped(|scope| async move {
                    let _noted = NoteDrop(stopped, scope);
                    started.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    eventually(SLACK, "the scoped body to start", || {
        let started = started.clone();
        async move { Ok(started.load(Ordering::SeqCst)) }
    })
    .await?;
    cut();
    let rival = ctx.client().await?;
    let granted = within(
        ttl * 3 + SLACK,
        "a rival to be granted the lost key",
        rival.lock(&key).wait_up_to(ttl * 3),
    )
    .await??;
    let granted_at = Instant::now();
    let outcome = within(SLACK, "with_lock to return after the loss", scoped)
        .await?
        .map_err(|e| crate::Failure(format!("the scoped task panicked: {e}")))?;
    expect_kind(outcome, ErrorKind::Lost, "with_lock whose lock was lost")?;
    let stopped = *lock_unpoisoned(&stopped);
    let Some((at, deadline)) = stopped else {
        return Err(crate::Failure("the body was never stopped".into()));
    };
    ensure!(
        deadline <= granted_at,
        "the holder's deadline came {:?} after the rival's grant",
        deadline - granted_at
    );
    // Sooner is fine (a session reported over ends its leases at once).
    ensure!(
        at <= deadline + SLACK,
        "the body was stopped {:?} after its deadline, not promptly",
        at - deadline
    );
    released(granted.release().await, "rival")?;
    Ok(())
}

/// Notes when it is dropped (when the scoped body's future is dropped), and the lease's
/// local deadline at that moment.
struct NoteDrop(Arc<Mutex<Option<(Instant, Instant)>>>, LockScope);

impl Drop for NoteDrop {
    fn drop(&mut self) {
        let noted = (Instant::now(), self.1.lease().valid_until());
        *lock_unpoisoned(&self.0) = Some(noted);
    }
}

/// 100 tasks of one client waiting for a held key are one remote waiter, not 100, and get
/// the key in the order they started waiting.
pub async fn local_waiters_are_one_remote_waiter_in_fifo_order(ctx: &Ctx) -> Outcome {
    const TASKS: usize = 100;
    let key = ctx.key("coalesced");
    let (client, faulty) = ctx.faulty_client().await?;
    // Held by another client: this client's head of line must wait in the store.
    let holder = ctx.client().await?.lock(&key).await?;
    let order: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (waiter, waited, order) = (client.clone(), key.clone(), order.clone());
        tasks.spawn(async move {
            let guard = waiter
                .lock(&waited)
                .wait_up_to(Duration::from_secs(60))
                .await?;
            lock_unpoisoned(&order).push(task);
            released(guard.release().await, "coalesced waiter")
        });
        // Each task starts waiting before the next one comes, so arrival order is known:
        // the first waits in the store, the others in the local line behind it.
        // Setup, not a promise: on a loaded machine a new task may take a while to run.
        eventually(SLACK * 10, "the task to line up", || {
            let (client, key, faulty) = (client.clone(), key.clone(), faulty.clone());
            async move { Ok(client.local_waiters(&key) == task && faulty.acquisitions_seen() >= 1) }
        })
        .await?;
    }
    ensure!(
        faulty.acquisitions_seen() == 1,
        "{TASKS} local waiters made {} remote acquisitions",
        faulty.acquisitions_seen()
    );
    released(holder.release().await, "holder")?;
    crate::harness::join_all(SLACK * 20, "the coalesced waiters", &mut tasks).await?;
    let order = lock_unpoisoned(&order).clone();
    ensure!(
        order == (0..TASKS).collect::<Vec<_>>(),
        "local waiters were not served in arrival order: {order:?}"
    );
    ensure!(
        client.local_waiters(&key) == 0,
        "the local line was not emptied"
    );
    Ok(())
}

/// Opt-in handoff: a release with a task of the same client waiting hands it the lease
/// without a store round trip, under the same fencing token; without the opt-in, each
/// task's ownership is its own, with a newer token, and the key goes through the store.
pub async fn local_handoff_is_opt_in_and_shares_the_token(ctx: &Ctx) -> Outcome {
    let key = ctx.key("handoff");
    let (client, faulty) = ctx.faulty_client().await?;
    for sharing in [LeaseSharing::OwnLease, LeaseSharing::SharedWithLocalWaiters] {
        let holder = client.lock(&key).lease_sharing(sharing).await?;
        let first_token = holder.token();
        let next = {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move {
                client
                    .lock(&key)
                    .lease_sharing(sharing)
                    .wait_up_to(Duration::from_secs(30))
                    .await
            })
        };
        eventually(SLACK, "the next task to line up", || async {
            Ok(client.local_waiters(&key) == 1)
        })
        .await?;
        let before = faulty.calls(Op::Acquire) + faulty.calls(Op::Release);
        released(holder.release().await, "first holder")?;
        let next = within(SLACK * 4, "the handover", next)
            .await?
            .map_err(|e| crate::Failure(format!("the next task panicked: {e}")))??;
        let round_trips = faulty.calls(Op::Acquire) + faulty.calls(Op::Release) - before;
        if sharing == LeaseSharing::SharedWithLocalWaiters {
            ensure!(
                next.token() == first_token && round_trips == 0,
                "a handoff gave token {} after {first_token} with {round_trips} store calls",
                next.token()
            );
        } else {
            ensure!(
                next.token() > first_token && round_trips >= 2,
                "without handoff the next task got token {} after {first_token} with {round_trips} store calls",
                next.token()
            );
        }
        released(next.release().await, "next holder")?;
    }
    // The handed lease was given back to the store at the end: a rival takes the key.
    let rival = ctx.client().await?.try_lock(&key).await?;
    released(rival.release().await, "rival")?;
    Ok(())
}
