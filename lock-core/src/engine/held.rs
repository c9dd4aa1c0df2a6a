//! A held lease: its state as the guard, its re-entries and the renewal engine see it, and
//! how it is given back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::Mutex;

use tokio::sync::watch;
use tracing::Instrument;

use crate::backend::{
    lock_unpoisoned, with_timeout, DynBackend, LockBackendExt, Ownership, ReleaseOutcome,
};
use crate::defects::{self, CoreDefect};
use crate::engine::cleanup::{Cleanup, CleanupOf};
use crate::engine::local::{Handoff, LocalTurn};
use crate::engine::{outcome_name, ClientCore};
use crate::observe;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::{FencingToken, Lease};
use crate::values::options::{AcquireOptions, LeaseSharing};

/// Why a lock was lost: what [`LockGuard::lost`](crate::LockGuard::lost) resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The local deadline passed without a successful renewal (or session keep-alive):
    /// the store was not reachable, or answered too late.
    DeadlinePassed,
    /// The store said the lease is no longer held: it expired there, or an operator
    /// broke the lock.
    NotHeld,
    /// The store ended the session that kept the lease alive.
    SessionEnded,
    /// The hold reached [`AcquireOptions::max_hold`](crate::AcquireOptions::max_hold) and
    /// was given back.
    HoldCapReached,
}

impl LossReason {
    /// A short name, as metrics label it (`deadline_passed`, `not_held`, `session_ended`,
    /// `hold_cap_reached`).
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::DeadlinePassed => "deadline_passed",
            LossReason::NotHeld => "not_held",
            LossReason::SessionEnded => "session_ended",
            LossReason::HoldCapReached => "hold_cap_reached",
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::DeadlinePassed => "the local deadline passed without a renewal",
            LossReason::NotHeld => "the store no longer held the lease",
            LossReason::SessionEnded => "the store ended the lease's session",
            LossReason::HoldCapReached => "the hold reached its max_hold cap",
        })
    }
}

/// How a held lock is doing, as [`LockGuard::health`](crate::LockGuard::health) tells:
/// the early warning that comes before a loss (Curator's `SUSPENDED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseHealth {
    /// The last renewal (or session keep-alive) was answered.
    Healthy,
    /// The last renewal failed, or the session lost its connection: the lease is still
    /// held until its local deadline, and the engine keeps trying, but work that cannot be
    /// undone should wait (or stop) until it is [`Healthy`](Self::Healthy) again.
    Suspended,
    /// The lease is lost, for this reason. Final.
    Lost(LossReason),
}

impl LeaseHealth {
    /// The reason, for a lost lease.
    pub fn loss_reason(self) -> Option<LossReason> {
        match self {
            LeaseHealth::Lost(reason) => Some(reason),
            _ => None,
        }
    }
}

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
    /// When the hold began (the grant, or the local handover).
    held_since: Instant,
    /// Healthy, suspended or lost: changed under `state`'s lock, watched by the guard.
    health: watch::Sender<LeaseHealth>,
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
    fn start(
        core: &Arc<ClientCore>,
        lease: Lease,
        options: AcquireOptions,
        release_again: Option<Duration>,
        local_turn: Option<LocalTurn>,
    ) -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let held_since = crate::values::clock::now();
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
            held_since,
            health: watch::Sender::new(LeaseHealth::Healthy),
            release_again,
            local_turn: Mutex::new(local_turn),
        });
        core.renewals.track(Arc::clone(&held));
        held
    }

    /// [`start`](Self::start), on a client that may have been shut down meanwhile: then
    /// the lease goes back to the store at once and the acquisition fails.
    pub(crate) async fn start_unless_shut_down(
        core: &Arc<ClientCore>,
        lease: Lease,
        options: AcquireOptions,
        release_again: Option<Duration>,
        local_turn: Option<LocalTurn>,
    ) -> Result<Arc<Self>> {
        let held = Self::start(core, lease, options, release_again, local_turn);
        if let Err(refused) = core.hold(&held) {
            // Lost or not, the lease is given back; the caller learns why it has none.
            let _ = held.finish().await;
            return Err(refused);
        }
        Ok(held)
    }

    pub(crate) fn backend(&self) -> &DynBackend {
        &self.core.backend
    }

    pub(crate) fn is_held(&self) -> bool {
        let state = lock_unpoisoned(&self.state);
        state.status == Status::Held && state.lease.is_valid()
    }

    /// Given back (released, left to expire, or by the client's shutdown), not lost.
    pub(crate) fn is_released(&self) -> bool {
        lock_unpoisoned(&self.state).status == Status::Released
    }

    pub(crate) fn snapshot(&self) -> LeaseState {
        lock_unpoisoned(&self.state).clone()
    }

    pub(crate) fn lease(&self) -> Lease {
        lock_unpoisoned(&self.state).lease.clone()
    }

    /// Resolves once the lease is lost; never for a lease that is released instead.
    pub(crate) async fn wait_lost(&self) {
        self.wait_loss().await;
    }

    /// Resolves with the reason once the lease is lost; never for a lease that is
    /// released instead.
    pub(crate) async fn wait_loss(&self) -> LossReason {
        self.wait_health(|health| matches!(health, LeaseHealth::Lost(_)))
            .await
            .loss_reason()
            .unwrap_or(LossReason::DeadlinePassed)
    }

    /// Resolves with the first health that satisfies `wanted`.
    pub(crate) async fn wait_health(
        &self,
        mut wanted: impl FnMut(&LeaseHealth) -> bool,
    ) -> LeaseHealth {
        let mut changes = self.health.subscribe();
        let seen = match changes.wait_for(|health| wanted(health)).await {
            Ok(health) => *health,
            // Never: the sender lives as long as `self`.
            Err(_) => *self.health.borrow(),
        };
        seen
    }

    pub(crate) fn health(&self) -> LeaseHealth {
        *self.health.borrow()
    }

    /// A renewal failed (or the session lost its connection) while the lease is still
    /// held: the early warning.
    pub(crate) fn suspended(&self) {
        let state = lock_unpoisoned(&self.state);
        let held = state.status == Status::Held;
        self.health.send_if_modified(|health| {
            let changed = held && *health == LeaseHealth::Healthy;
            if changed {
                *health = LeaseHealth::Suspended;
            }
            changed
        });
    }

    /// A renewal (or keep-alive) was answered again.
    fn recovered(&self) {
        self.health.send_if_modified(|health| {
            let changed = *health == LeaseHealth::Suspended;
            if changed {
                *health = LeaseHealth::Healthy;
            }
            changed
        });
    }

    /// Records a renewal unless the lease ended meanwhile, or a later one was recorded.
    pub(crate) fn renewed(&self, lease: Lease) {
        let lease = if defects::active(CoreDefect::LeaseFromReply) {
            lease.renewed(lease.ttl(), crate::values::clock::now())
        } else {
            lease
        };
        let mut state = lock_unpoisoned(&self.state);
        if state.status == Status::Held
            && state.lease.id() == lease.id()
            && lease.sent_at() > state.lease.sent_at()
        {
            state.lease = lease;
            self.recovered();
        }
    }

    /// Marks the lease lost for `reason` and, in case the store still has it (a renewal
    /// that landed after we gave up on it, or a hold cut at its cap), releases it in the
    /// background so it blocks nobody.
    pub(crate) fn mark_lost(&self, reason: LossReason, why: &str) {
        let changed = {
            let mut state = lock_unpoisoned(&self.state);
            let was_held = state.status == Status::Held;
            if was_held {
                state.status = Status::Lost;
                self.health.send_replace(LeaseHealth::Lost(reason));
            }
            was_held
        };
        if changed {
            // The store may grant the key to anyone now, so this client's next task may
            // try for it too.
            drop(lock_unpoisoned(&self.local_turn).take());
            let backend = self.backend().name();
            observe::lost(backend, reason.as_str());
            observe::hold_ended(backend, true, crate::values::clock::since(self.held_since));
            tracing::warn!(backend, key = %self.key, token = %self.token, lease = %observe::lease_prefix(self.lease().id()), reason = reason.as_str(), why, "lock lost");
            // A hold left to expire (a once ticket's) ends by its TTL alone, by the store's
            // clock: released at its local deadline, it would free the key a drift
            // allowance early, inside the window it keeps.
            if !self.core.left_to_expire(self.id) {
                self.spawn_release(Some(Duration::ZERO));
            }
        }
    }

    /// When [`AcquireOptions::max_hold`] ends this hold, if it is capped.
    pub(crate) fn hold_cap(&self) -> Option<Instant> {
        self.options
            .max_hold
            .map(|cap| crate::values::options::saturating_add(self.held_since, cap))
    }

    /// The hold ended by a release (or was left to expire).
    fn released(&self) {
        observe::hold_ended(
            self.backend().name(),
            false,
            crate::values::clock::since(self.held_since),
        );
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
            self.mark_lost(
                LossReason::DeadlinePassed,
                "renewal requested after the local deadline",
            );
            return Err(self.lost_error());
        }
        let span = tracing::info_span!("distlock.renew", backend = self.backend().name(), key = %self.key, lease = %observe::lease_prefix(state.lease.id()), outcome = tracing::field::Empty);
        let sent = crate::values::clock::now();
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
        observe::renewal_call(self.backend().name(), crate::values::clock::since(sent));
        match result {
            Ok(lease) => {
                self.renewed(lease);
                Ok(())
            }
            Err(err) => {
                if err.kind() == ErrorKind::Lost {
                    self.mark_lost(LossReason::NotHeld, err.message());
                } else if !self.lease().is_valid() {
                    // Judged by the lease as it is now: the engine may have renewed it while
                    // this call was on its way.
                    self.mark_lost(LossReason::DeadlinePassed, err.message());
                } else {
                    observe::renewal_failed(
                        self.backend().name(),
                        outcome_name::<()>(&Err(err.clone())),
                    );
                    self.suspended();
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
            let span = tracing::info_span!("distlock.renew", backend = self.backend().name(), key = %self.key, lease = %observe::lease_prefix(lease.id()), outcome = tracing::field::Empty);
            let kept = with_timeout(
                self.backend().name(),
                self.options.request_timeout.min(lease.remaining()),
                "expire_in",
                self.backend().expire_in(
                    &self.key,
                    lease.id(),
                    self.backend().capabilities().store_ttl(ttl),
                ),
            )
            .instrument(span.clone())
            .await;
            span.record("outcome", outcome_name(&kept));
            if kept? == Ownership::NotHeld {
                self.mark_lost(LossReason::NotHeld, "the store no longer had the lease");
                return Err(self.lost_error());
            }
        }
        let mut state = lock_unpoisoned(&self.state);
        if state.status != Status::Held {
            return Err(self.lost_error());
        }
        state.status = Status::Released;
        drop(state);
        self.released();
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
        // A lost lease stays lost: every guard that shares it (a reentrant owner's) hears so.
        // A lease whose local deadline has passed is lost too, whether or not the engine
        // has marked it yet (a busy runtime runs its timer late): the holder acted
        // unprotected since, though the store may still have the lease.
        let (previous, expired) = {
            let mut state = lock_unpoisoned(&self.state);
            let previous = state.status;
            let expired = previous == Status::Held && !state.lease.is_valid();
            if previous == Status::Held && !expired {
                state.status = Status::Released;
            }
            (previous, expired)
        };
        if expired {
            self.mark_lost(
                LossReason::DeadlinePassed,
                "released after the local deadline",
            );
            return Err(self.lost_error());
        }
        match previous {
            Status::Held => self.released(),
            Status::Lost => return Err(self.lost_error()),
            Status::Released => return Ok(()),
        }
        let lease = self.lease();
        let shared = self.options.lease_sharing == LeaseSharing::SharedWithLocalWaiters;
        if shared && lease.is_valid() && self.release_again.is_none() {
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
        let span = tracing::info_span!("distlock.release", backend = self.backend().name(), key = %self.key, lease = %observe::lease_prefix(lease.id()), token = %self.token, outcome = tracing::field::Empty);
        let result = release_with_retry(self.backend(), &lease, &self.options)
            .instrument(span.clone())
            .await
            .and_then(|ownership| {
                if ownership.is_held() {
                    Ok(())
                } else {
                    Err(self.lost_error())
                }
            });
        span.record("outcome", outcome_name(&result));
        unfinished.0 = None;
        // Unanswered until the lease ran out: the store may still have it (and, on a
        // session store, keep it for as long as the session lives), so the release goes
        // on in the background.
        let unanswered = result.as_ref().is_err_and(crate::backend::unanswered);
        self.spawn_release(unanswered.then_some(Duration::ZERO));
        self.core.renewals.finished(self.id);
        result
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.core.forget(self.id);
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
/// [`Ownership::NotHeld`] when the lease turned out not to be held.
async fn release_with_retry(
    backend: &DynBackend,
    lease: &Lease,
    options: &AcquireOptions,
) -> Result<Ownership> {
    let (outcome, tries) = options
        .backoff
        .retry_until(
            Some(lease.valid_until()),
            |err: &Error| err.kind() == ErrorKind::Unavailable && lease.is_valid(),
            || {
                let timeout = options
                    .request_timeout
                    .min(lease.remaining())
                    .max(options.request_timeout / 10);
                backend.release_lease(lease, timeout)
            },
        )
        .await;
    match outcome {
        Ok(ReleaseOutcome::Released) => Ok(Ownership::Held),
        // Gone before its deadline: our own unanswered attempt released it; if no attempt
        // went unanswered the store lost it (a restart without persistence).
        Ok(ReleaseOutcome::AlreadyReleased) => Ok(Ownership::held_if(
            tries > 1 && !defects::active(CoreDefect::RetriedReleaseLost),
        )),
        Err(err) if err.kind() == ErrorKind::Lost => Ok(Ownership::NotHeld),
        Err(err) => Err(err),
    }
}
