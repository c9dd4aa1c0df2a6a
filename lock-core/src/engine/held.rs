//! A held lease: its state as the guard, its re-entries and the renewal engine see it, and
//! how it is given back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;

use tokio::sync::Notify;
use tracing::Instrument;

use crate::backend::{lock_unpoisoned, with_timeout, DynBackend, LockBackendExt, ReleaseOutcome};
use crate::engine::cleanup::{Cleanup, CleanupOf};
use crate::engine::local::{Handoff, LocalTurn};
use crate::engine::{outcome_name, ClientCore};
use crate::error::{Error, ErrorKind, Result};
use crate::key::LockKey;
use crate::lease::{FencingToken, Lease};
use crate::options::AcquireOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Held,
    Lost,
    Released,
}

#[derive(Clone, Debug)]
pub(crate) struct LeaseState {
    pub(crate) lease: Lease,
    pub(crate) status: Status,
}

/// The state shared by a guard, its re-entries and the client's renewal engine.
#[derive(Debug)]
pub(crate) struct HeldLock {
    /// Tells held locks apart inside the renewal engine.
    pub(crate) id: u64,
    pub(crate) core: Arc<ClientCore>,
    pub(crate) key: LockKey,
    pub(crate) token: FencingToken,
    pub(crate) options: AcquireOptions,
    state: Mutex<LeaseState>,
    /// Signalled when the lease is lost (the only change anyone waits for).
    lost: Notify,
    /// Release the lease id once more this long after the hold ends: an attempt of the
    /// acquisition went unanswered and may still land in the store.
    release_again: Option<Duration>,
    /// This task's turn in the client's local line for the key, handed on to the next
    /// task when the hold ends.
    local_turn: Mutex<Option<LocalTurn>>,
}

impl HeldLock {
    /// Takes over `lease` and hands it to the client's renewal engine (which also marks a
    /// lease lost when its deadline passes).
    pub(crate) fn start(
        core: &Arc<ClientCore>,
        lease: Lease,
        options: AcquireOptions,
        release_again: Option<Duration>,
        local_turn: Option<LocalTurn>,
    ) -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let held = Arc::new(HeldLock {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            core: Arc::clone(core),
            key: lease.key().clone(),
            token: lease.token(),
            options,
            state: Mutex::new(LeaseState {
                lease,
                status: Status::Held,
            }),
            lost: Notify::new(),
            release_again,
            local_turn: Mutex::new(local_turn),
        });
        core.renewals.track(Arc::clone(&held));
        held
    }

    pub(crate) fn backend(&self) -> &DynBackend {
        &self.core.backend
    }

    pub(crate) fn is_held(&self) -> bool {
        let state = lock_unpoisoned(&self.state);
        state.status == Status::Held && state.lease.is_valid()
    }

    pub(crate) fn snapshot(&self) -> LeaseState {
        lock_unpoisoned(&self.state).clone()
    }

    pub(crate) fn lease(&self) -> Lease {
        lock_unpoisoned(&self.state).lease.clone()
    }

    /// Resolves once the lease is lost; never for a lease that is released instead.
    pub(crate) async fn wait_lost(&self) {
        loop {
            let notified = self.lost.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the look, so a loss between the two is not missed.
            notified.as_mut().enable();
            if lock_unpoisoned(&self.state).status == Status::Lost {
                return;
            }
            notified.await;
        }
    }

    /// Records a renewal unless the lease ended meanwhile, or a later one was recorded.
    pub(crate) fn renewed(&self, lease: Lease) {
        let mut state = lock_unpoisoned(&self.state);
        if state.status == Status::Held
            && state.lease.id() == lease.id()
            && lease.sent_at() > state.lease.sent_at()
        {
            state.lease = lease;
        }
    }

    /// Marks the lease lost and, in case the store still has it (a renewal that landed
    /// after we gave up on it), releases it in the background so it blocks nobody.
    pub(crate) fn mark_lost(&self, why: &str) {
        let changed = {
            let mut state = lock_unpoisoned(&self.state);
            let was_held = state.status == Status::Held;
            if was_held {
                state.status = Status::Lost;
            }
            was_held
        };
        if changed {
            // The store may grant the key to anyone now, so this client's next task may
            // try for it too.
            drop(lock_unpoisoned(&self.local_turn).take());
            self.lost.notify_waiters();
            tracing::warn!(backend = self.backend().name(), key = %self.key, token = %self.token, why, "lock lost");
            self.spawn_release(Some(Duration::ZERO));
        }
    }

    /// Releases the lease in the background: at once when `now` is given, then again
    /// after an unanswered attempt's landing window.
    fn spawn_release(&self, now: Option<Duration>) {
        let schedule: Vec<Duration> = now.into_iter().chain(self.release_again).collect();
        if schedule.is_empty() {
            return;
        }
        CleanupOf {
            what: Cleanup::Release,
            key: self.key.clone(),
            lease_id: self.lease().id(),
            timeout: self.options.request_timeout,
            ttl: self.options.ttl,
        }
        .spawn(self.backend(), &schedule);
    }

    /// Renews the lease now (manual renewal, or a guard's explicit call).
    pub(crate) async fn renew_now(&self) -> Result<()> {
        let state = self.snapshot();
        if state.status != Status::Held || !state.lease.is_valid() {
            self.mark_lost("renewal requested after the local deadline");
            return Err(self.lost_error());
        }
        let span = tracing::info_span!("distlock.renew", backend = self.backend().name(), key = %self.key, outcome = tracing::field::Empty);
        let result = self
            .backend()
            .renew_lease(
                &state.lease,
                self.options.ttl,
                self.options.request_timeout.min(state.lease.remaining()),
            )
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome_name(&result));
        match result {
            Ok(lease) => {
                self.renewed(lease);
                Ok(())
            }
            Err(err) => {
                if err.kind() == ErrorKind::Lost || !state.lease.is_valid() {
                    self.mark_lost(err.message());
                }
                Err(err)
            }
        }
    }

    /// Ends the holder's interest without giving the key back: the store keeps the hold
    /// until it expires, set to end exactly `ttl` from now if given (which may shorten
    /// it). For a hold that must last a minimum time from its start.
    pub(crate) async fn leave_to_expire(&self, ttl: Option<Duration>) -> Result<()> {
        let _turn = lock_unpoisoned(&self.local_turn).take();
        let lease = self.lease();
        if !self.is_held() {
            return Err(self.lost_error());
        }
        if let Some(ttl) = ttl {
            let span = tracing::info_span!("distlock.renew", backend = self.backend().name(), key = %self.key, outcome = tracing::field::Empty);
            let kept = with_timeout(
                self.options.request_timeout.min(lease.remaining()),
                "expire_in",
                self.backend().expire_in(&self.key, lease.id(), ttl),
            )
            .instrument(span.clone())
            .await;
            span.record("outcome", outcome_name(&kept));
            if !kept? {
                self.mark_lost("the store no longer had the lease");
                return Err(self.lost_error());
            }
        }
        let mut state = lock_unpoisoned(&self.state);
        if state.status != Status::Held {
            return Err(self.lost_error());
        }
        state.status = Status::Released;
        drop(state);
        self.core.renewals.finished(self.id);
        Ok(())
    }

    pub(crate) fn lost_error(&self) -> Error {
        Error::lost(format!(
            "the lease on {:?} (token {}) was lost before it was released",
            self.key.as_str(),
            self.token
        ))
    }

    /// Ends the hold in the store. `Ok` when the lease was held until released;
    /// [`ErrorKind::Lost`] when it had been lost (expired, or the store no longer had it):
    /// whatever the holder did after that was not protected by the lock.
    pub(crate) async fn finish(&self) -> Result<()> {
        // The next local task goes to the store once this release is done (or abandoned).
        let mut turn = lock_unpoisoned(&self.local_turn).take();
        let previous =
            std::mem::replace(&mut lock_unpoisoned(&self.state).status, Status::Released);
        match previous {
            Status::Held => {}
            Status::Lost => return Err(self.lost_error()),
            Status::Released => return Ok(()),
        }
        let lease = self.lease();
        if self.options.local_handoff && lease.is_valid() && self.release_again.is_none() {
            if let Some(next) = turn.take() {
                let handoff = Handoff {
                    lease: lease.clone(),
                    backend: self.backend().clone(),
                    request_timeout: self.options.request_timeout,
                };
                // When nobody waits it comes back: an ordinary release follows.
                if next.hand_off(handoff).is_none() {
                    self.core.renewals.finished(self.id);
                    return Ok(());
                }
            }
        }
        let _turn = turn;
        // A caller that stops waiting does not cancel the release: it is sent again in the
        // background (release is idempotent).
        let mut unfinished = Unfinished(Some(self));
        let span = tracing::info_span!("distlock.release", backend = self.backend().name(), key = %self.key, token = %self.token, outcome = tracing::field::Empty);
        let result = release_with_retry(self.backend(), &lease, &self.options)
            .instrument(span.clone())
            .await
            .and_then(|held| if held { Ok(()) } else { Err(self.lost_error()) });
        span.record("outcome", outcome_name(&result));
        unfinished.0 = None;
        // Unanswered until the lease ran out: the store may still have it (and, on a
        // session store, keep it for as long as the session lives), so the release goes
        // on in the background.
        let unanswered = result
            .as_ref()
            .is_err_and(|err| matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::TimedOut));
        self.spawn_release(unanswered.then_some(Duration::ZERO));
        self.core.renewals.finished(self.id);
        result
    }
}

/// A release whose caller stopped waiting for it.
struct Unfinished<'a>(Option<&'a HeldLock>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.spawn_release(Some(Duration::ZERO));
            held.core.renewals.finished(held.id);
        }
    }
}

/// Retries an unanswered release while the lease is valid: release is idempotent, and a
/// retry that finds the lease gone before its deadline knows an earlier attempt worked.
/// `Ok(false)` when the lease turned out not to be held.
async fn release_with_retry(
    backend: &DynBackend,
    lease: &Lease,
    options: &AcquireOptions,
) -> Result<bool> {
    let mut unanswered = false;
    let mut attempt = 0;
    loop {
        let timeout = options
            .request_timeout
            .min(lease.remaining())
            .max(options.request_timeout / 10);
        match backend.release_lease(lease, timeout).await {
            Ok(ReleaseOutcome::Released) => return Ok(true),
            // Gone before its deadline: our own unanswered attempt released it; if no
            // attempt went unanswered the store lost it (a restart without persistence).
            Ok(ReleaseOutcome::AlreadyReleased) => return Ok(unanswered),
            Err(err) if err.kind() == ErrorKind::Lost => return Ok(false),
            Err(err) if err.kind() == ErrorKind::Unavailable && lease.is_valid() => {
                tracing::debug!(error = %err, "release unanswered; retrying");
                unanswered = true;
                let pause = options.backoff.pause(attempt);
                attempt += 1;
                tokio::time::sleep(pause.min(lease.remaining())).await;
            }
            Err(err) => return Err(err),
        }
    }
}
