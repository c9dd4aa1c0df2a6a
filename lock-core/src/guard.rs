//! A held lock: the guard users keep, its watchdog and its lost-lock signal.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant as TokioInstant};
use tracing::Instrument;

use crate::backend::{DynBackend, LockBackendExt, ReleaseOutcome};
use crate::detach::finish_if_dropped;
use crate::error::{Error, ErrorKind, Result};
use crate::key::LockKey;
use crate::lease::{FencingToken, Lease};
use crate::options::{AcquireOptions, Renewal};
use crate::owner::Reentry;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Held,
    Lost,
    Released,
}

#[derive(Clone, Debug)]
struct LeaseState {
    lease: Lease,
    status: Status,
}

/// The state shared by a guard, its re-entries and its watchdog.
#[derive(Debug)]
pub(crate) struct HeldLock {
    backend: DynBackend,
    key: LockKey,
    token: FencingToken,
    options: AcquireOptions,
    state: watch::Sender<LeaseState>,
    keeper: Mutex<Option<AbortHandle>>,
    /// Release the lease id once more this long after the hold ends: an attempt of the
    /// acquisition went unanswered and may still land in the store.
    release_again: Option<Duration>,
}

impl HeldLock {
    /// Takes over `lease` and starts its watchdog (which also marks a manually renewed
    /// lease lost when its deadline passes).
    pub(crate) fn start(
        backend: DynBackend,
        lease: Lease,
        options: AcquireOptions,
        release_again: Option<Duration>,
    ) -> Arc<Self> {
        let held = Arc::new(HeldLock {
            backend,
            key: lease.key().clone(),
            token: lease.token(),
            options,
            state: watch::Sender::new(LeaseState {
                lease,
                status: Status::Held,
            }),
            keeper: Mutex::new(None),
            release_again,
        });
        let task = tokio::spawn(keep_alive(Arc::clone(&held)));
        *lock(&held.keeper) = Some(task.abort_handle());
        held
    }

    pub(crate) fn is_held(&self) -> bool {
        let state = self.state.borrow();
        state.status == Status::Held && state.lease.is_valid()
    }

    fn lease(&self) -> Lease {
        self.state.borrow().lease.clone()
    }

    fn stop_keeper(&self) {
        if let Some(keeper) = lock(&self.keeper).take() {
            keeper.abort();
        }
    }

    /// Records a successful renewal unless the lease ended meanwhile.
    fn renewed(&self, lease: Lease) {
        self.state.send_if_modified(|state| {
            let same = state.status == Status::Held && state.lease.id() == lease.id();
            if same {
                state.lease = lease;
            }
            same
        });
    }

    /// Marks the lease lost and, in case the store still has it (a renewal that landed
    /// after we gave up on it), releases it in the background so it blocks nobody.
    fn mark_lost(&self, why: &str) {
        let changed = self.state.send_if_modified(|state| {
            let was_held = state.status == Status::Held;
            if was_held {
                state.status = Status::Lost;
            }
            was_held
        });
        if changed {
            tracing::warn!(backend = self.backend.name(), key = %self.key, token = %self.token, why, "lock lost");
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
        spawn_release(
            self.backend.clone(),
            self.key.clone(),
            self.lease().id(),
            self.options.request_timeout,
            &schedule,
        );
    }

    async fn renew_now(&self) -> Result<()> {
        let state = self.state.borrow().clone();
        if state.status != Status::Held || !state.lease.is_valid() {
            self.mark_lost("renewal requested after the local deadline");
            return Err(Error::lost(format!(
                "lease on {:?} is no longer held",
                self.key.as_str()
            )));
        }
        let span = tracing::info_span!("distlock.renew", backend = self.backend.name(), key = %self.key, outcome = tracing::field::Empty);
        let result = self
            .backend
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

    /// Ends the hold in the store; `Ok(true)` if the lease was still held until then.
    pub(crate) async fn finish(&self) -> Result<bool> {
        self.stop_keeper();
        let mut previous = Status::Released;
        self.state.send_if_modified(|state| {
            previous = state.status;
            state.status = Status::Released;
            previous != Status::Released
        });
        if previous != Status::Held {
            return Ok(false);
        }
        let lease = self.lease();
        let span = tracing::info_span!("distlock.release", backend = self.backend.name(), key = %self.key, token = %self.token, outcome = tracing::field::Empty);
        let result = release_with_retry(&self.backend, &lease, &self.options)
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome_name(&result));
        self.spawn_release(None);
        result
    }
}

/// Retries an unanswered release while the lease is valid: release is idempotent, and a
/// retry that finds the lease gone before its deadline knows an earlier attempt worked.
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

/// Renews at a third of the TTL, retrying failures until the local deadline; at the
/// deadline the lease is lost. With manual renewal it only watches the deadline.
async fn keep_alive(held: Arc<HeldLock>) {
    let mut changes = held.state.subscribe();
    loop {
        let lease = {
            let state = changes.borrow_and_update();
            if state.status != Status::Held {
                return;
            }
            state.lease.clone()
        };
        let deadline = lease.valid_until();
        let wake = match held.options.renewal {
            Renewal::Auto => lease.sent_at() + lease.ttl() / 3,
            Renewal::Manual => deadline,
        };
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            () = sleep_until(TokioInstant::from_std(wake.min(deadline))) => {}
        }
        // A renewal may have landed in the same timer tick as the old deadline: judge by
        // the lease as it is now, not as it was when the sleep began.
        {
            let state = held.state.borrow();
            if state.status != Status::Held {
                return;
            }
            if state.lease != lease {
                continue;
            }
        }
        if held.options.renewal == Renewal::Manual || Instant::now() >= deadline {
            held.mark_lost("the local deadline passed without a renewal");
            return;
        }
        let mut attempt = 0;
        loop {
            match held.renew_now().await {
                Ok(()) => break,
                Err(err) if err.kind() == ErrorKind::Lost || !lease.is_valid() => {
                    held.mark_lost(err.message());
                    return;
                }
                Err(err) => {
                    tracing::debug!(error = %err, key = %held.key, "renewal failed; retrying until the deadline");
                    let pause = held.options.backoff.pause(attempt).min(lease.remaining());
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

/// Releases a lease id in the background, once after each pause of `schedule` (each
/// measured from the previous release), for a guard dropped without `release`, a lost
/// lease, or an acquisition abandoned mid-flight. Without a runtime the store's TTL ends
/// the hold.
///
/// A later release covers a request that reaches the store after the earlier one (a store
/// applies what was sent even when nobody waits for the reply); releasing a lease id
/// nobody else uses is always harmless.
pub(crate) fn spawn_release(
    backend: DynBackend,
    key: LockKey,
    lease_id: crate::LeaseId,
    timeout: Duration,
    schedule: &[Duration],
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(%key, "no runtime to release on; the lease will expire by its TTL");
        return;
    };
    let schedule = schedule.to_vec();
    runtime.spawn(async move {
        for pause in schedule {
            tokio::time::sleep(pause).await;
            let released =
                crate::backend::with_timeout(timeout, "release", backend.release(&key, lease_id))
                    .await;
            if let Err(err) = released {
                tracing::debug!(error = %err, %key, "background release failed; the lease will expire by its TTL");
            }
        }
    });
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn outcome_name<T>(result: &Result<T>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(err) => match err.kind() {
            ErrorKind::HeldByAnother => "held_by_another",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Lost => "lost",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Misconfigured => "misconfigured",
            _ => "internal",
        },
    }
}

/// Proof of holding a lock.
///
/// [`release`](Self::release) is the real way to give the lock back: it waits for the
/// store and says whether the lease was still held. Dropping the guard stops the watchdog
/// at once and releases in the background, best effort; if that cannot reach the store the
/// lease ends by its TTL.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    held: Arc<HeldLock>,
    reentry: Option<Reentry>,
    done: bool,
}

impl LockGuard {
    pub(crate) fn new(held: Arc<HeldLock>, reentry: Option<Reentry>) -> Self {
        LockGuard {
            held,
            reentry,
            done: false,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<HeldLock> {
        &self.held
    }

    pub(crate) fn set_reentry(&mut self, reentry: Reentry) {
        self.reentry = Some(reentry);
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.held.key
    }

    /// The fencing token of this ownership: pass it to every resource the lock protects.
    pub fn token(&self) -> FencingToken {
        self.held.token
    }

    /// The current lease (its deadline moves with each renewal).
    pub fn lease(&self) -> Lease {
        self.held.lease()
    }

    /// Whether the lease is held and its local deadline is ahead. Cheap: no store call.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Resolves when the lease is lost: its local deadline passed without a successful
    /// renewal, or the store said it is no longer held. It fires before the store can
    /// grant the key to anyone else (the deadline ends a drift allowance before the store's
    /// expiry). It never resolves for a lease that was released.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut changes = self.held.state.subscribe();
        async move {
            loop {
                if changes.borrow_and_update().status == Status::Lost {
                    return;
                }
                if changes.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Renews the lease now, for [`Renewal::Manual`] (allowed with automatic renewal too).
    /// A lease that is no longer held gives [`ErrorKind::Lost`].
    pub async fn renew(&self) -> Result<()> {
        self.held.renew_now().await
    }

    /// Gives the lock back. Returns whether the lease was still held at release time
    /// (`false` if it had been lost). For a re-entered lock, only the outermost release
    /// touches the store; inner ones return whether the lock is still held.
    ///
    /// Cancelling the returned future does not cancel the release: it goes on in the
    /// background, as for a dropped guard.
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        if let Some(reentry) = self.reentry.take() {
            if !reentry.leave(&self.held) {
                return Ok(self.held.is_held());
            }
        }
        let held = Arc::clone(&self.held);
        finish_if_dropped(async move { held.finish().await }).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(reentry) = self.reentry.take() {
            if !reentry.leave(&self.held) {
                return;
            }
        }
        self.held.stop_keeper();
        let held = Arc::clone(&self.held);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = held.finish().await {
                    tracing::debug!(error = %err, "background release failed; the lease will expire by its TTL");
                }
            });
        }
    }
}
