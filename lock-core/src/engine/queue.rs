//! Waiting in a fair backend's queue ([`Capabilities::fair_ordering`]).
//!
//! The core drives the queue the same way on every fair store: enqueue (retried with the
//! same lease id, which the store must treat as one entry), then attempt as a queued
//! waiter whenever the waiter's turn may have come (woken by [`watch_turn`], or by the
//! fallback poll, which also keeps the entry alive), and on any ending without a grant
//! (time-out, error, cancellation) leave the queue.
//!
//! [`Capabilities::fair_ordering`]: crate::Capabilities::fair_ordering
//! [`watch_turn`]: crate::backend::LockBackend::watch_turn

use std::time::{Duration, Instant};

use crate::backend::{with_timeout, AcquireRequest, DynBackend, LockBackendExt, QueuedAttempt};
use crate::defects::{self, CoreDefect};
use crate::engine::cleanup::{Cleanup, CleanupOf};
use crate::engine::poll::{WaitStart, Wakes};
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::Lease;
use crate::values::options::WaitSpec;

pub(crate) async fn acquire_in_queue(
    backend: &DynBackend,
    request: &AcquireRequest,
    wait: &WaitSpec,
) -> Result<Lease> {
    let mut place = QueuePlace {
        backend: backend.clone(),
        request: request.clone(),
        leave: Some(CleanupOf {
            what: Cleanup::LeaveQueue,
            key: request.key().clone(),
            lease_id: request.lease_id(),
            timeout: wait.request_timeout,
            ttl: request.ttl(),
        }),
    };
    // The fallback poll keeps a live waiter's entry from expiring like a dead one's.
    let spec = WaitSpec {
        backoff: crate::values::options::Backoff {
            max: wait
                .backoff
                .max
                .min(request.ttl() / 3)
                .max(Duration::from_millis(1)),
            ..wait.backoff
        },
        ..*wait
    };
    enqueue_within(backend, request, &spec).await?;
    let subscribing: crate::engine::poll::Subscribing<'_> = Box::pin(backend.watch_turn(request));
    let result = crate::engine::poll::wait_for_grant(
        request.key(),
        &spec,
        // The enqueue was answered: the store is answering.
        WaitStart {
            wakes: Wakes::Turn,
            store_answered: true,
        },
        Some(subscribing),
        |timeout| {
            async move {
                match backend.acquire_queued_once(request, timeout).await? {
                    QueuedAttempt::Granted(lease) => Ok(lease),
                    QueuedAttempt::Waiting => Err(waiting(request.key())),
                    // Expired or removed: back in the queue, behind everyone there now.
                    QueuedAttempt::NotQueued => {
                        enqueue(backend, request, timeout).await?;
                        Err(waiting(request.key()))
                    }
                }
            }
        },
    )
    .await;
    match &result {
        Ok(_) => place.leave = None,
        // Left before the caller hears of the failure where the wait leaves time for it, so
        // the queue it sees is clean; a bounded wait never overruns its bound for it.
        Err(_) => place.leave(wait.until).await,
    }
    result
}

/// Enqueues, retrying an unanswered enqueue (with the same lease id) within the wait.
async fn enqueue_within(
    backend: &DynBackend,
    request: &AcquireRequest,
    wait: &WaitSpec,
) -> Result<()> {
    let mut attempt = 0;
    loop {
        let timeout = match wait.until {
            Some(until) => until
                .saturating_duration_since(crate::values::clock::now())
                .min(wait.request_timeout)
                .max(Duration::from_millis(1)),
            None => wait.request_timeout,
        };
        match enqueue(backend, request, timeout).await {
            Err(err) if err.kind() == ErrorKind::Unavailable => {
                let pause = wait.backoff.pause(attempt);
                attempt += 1;
                if wait.until.is_some_and(|until| {
                    crate::values::options::saturating_add(crate::values::clock::now(), pause)
                        >= until
                }) {
                    return Err(err);
                }
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

async fn enqueue(backend: &DynBackend, request: &AcquireRequest, timeout: Duration) -> Result<()> {
    let sent = crate::values::clock::now();
    let result = request
        .attempt(with_timeout(
            backend.name(),
            timeout,
            "enqueue",
            backend.enqueue(request),
        ))
        .await;
    if let Err(err) = &result {
        if err.kind() == ErrorKind::Unavailable {
            request.note_unanswered();
        }
        tracing::debug!(error = %err, elapsed = ?crate::values::clock::since(sent), "enqueue failed");
    }
    result
}

fn waiting(key: &LockKey) -> Error {
    Error::new(
        ErrorKind::HeldByAnother,
        format!("{:?} is held or others queue ahead", key.as_str()),
    )
}

/// How long a bounded wait that ran out may still wait for its leave of the queue before
/// returning: a healthy store answers well within it, so the caller then sees a clean
/// queue; a slow one does not get to stretch the wait, and the leave goes on in the
/// background.
const LEAVE_GRACE: Duration = Duration::from_millis(100);

/// Leaves the queue however the wait ends without a grant, in the background so that a
/// cancelled waiter still leaves, and again and again until the store answers; once more
/// a request timeout later when an enqueue may still land (it went unanswered, or was
/// abandoned on its way).
struct QueuePlace {
    backend: DynBackend,
    request: AcquireRequest,
    leave: Option<CleanupOf>,
}

impl QueuePlace {
    /// When to leave again after a first leave now.
    fn again(&self, timeout: Duration) -> Option<Duration> {
        self.request.may_land_late().then_some(timeout)
    }

    /// Leaves now, within what is left of the wait (`until`), and in the background for
    /// whatever that does not finish.
    async fn leave(&mut self, until: Option<Instant>) {
        if defects::active(CoreDefect::QueueEntryKept) {
            self.leave = None;
        }
        // The clean-up stays armed until the leave is answered: a wait dropped while its
        // leave is on its way (a slow store) must still leave, from `Drop`.
        let Some((key, lease_id, timeout)) = self
            .leave
            .as_ref()
            .map(|leave| (leave.key.clone(), leave.lease_id, leave.timeout))
        else {
            return;
        };
        let budget = match until {
            Some(until) => until
                .saturating_duration_since(crate::values::clock::now())
                .max(LEAVE_GRACE)
                .min(timeout),
            None => timeout,
        };
        let left = with_timeout(
            self.backend.name(),
            budget,
            "leave_queue",
            self.backend.leave_queue(&key, lease_id),
        )
        .await;
        let Some(leave) = self.leave.take() else {
            return;
        };
        let retry = match left {
            Ok(()) => None,
            Err(err) => {
                tracing::debug!(error = %err, key = %leave.key, "leaving the queue in the background");
                Some(Duration::ZERO)
            }
        };
        let schedule: Vec<Duration> = retry.into_iter().chain(self.again(leave.timeout)).collect();
        if !schedule.is_empty() {
            leave.spawn(&self.backend, &schedule);
        }
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if defects::active(CoreDefect::QueueEntryKept) {
            self.leave = None;
        }
        if let Some(leave) = self.leave.take() {
            let schedule: Vec<Duration> = std::iter::once(Duration::ZERO)
                .chain(self.again(leave.timeout))
                .collect();
            leave.spawn(&self.backend, &schedule);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{LockClient, MemoryBackend};

    /// A runtime that shuts down drops its parked tasks, and with them a queued waiter's
    /// place. Leaving the queue then spawns onto that closing runtime, which drops the new
    /// task unpolled; before the fix, the place inside it spawned again from its own drop
    /// until the worker's stack overflowed and the process aborted.
    #[test]
    fn a_queued_waiter_dropped_by_a_closing_runtime_does_not_respawn_forever() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let store = Arc::new(MemoryBackend::fair());
        let client = LockClient::new(store.clone());
        // A client of its own, so it queues in the store rather than behind the holder
        // in this process.
        let waiter = LockClient::new(store);
        runtime.block_on(async {
            let holder = client.try_lock("k").await.unwrap();
            tokio::spawn(async move {
                let _never = waiter.lock("k").wait_up_to(Duration::from_secs(3600)).await;
            });
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while client.inspect("k").await.unwrap().unwrap().waiters != Some(1) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the waiter never queued"
                );
                tokio::task::yield_now().await;
            }
            std::mem::forget(holder);
        });
        drop(runtime);
    }
}
