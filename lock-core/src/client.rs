//! What users call: a client over any backend, and the lock request builder.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backend::{DynBackend, LockBackend, LockBackendExt, LockInfo};
use crate::error::{Error, ErrorKind, Result};
use crate::guard::{outcome_name, spawn_release, HeldLock, LockGuard};
use crate::key::LockKey;
use crate::lease::{AcquireRequest, Lease, LeaseId};
use crate::options::{saturating_add, AcquireOptions, Renewal, Wait, WaitSpec};
use crate::owner::LockOwner;

/// Locks keys on one backend. Cheap to clone; clones share the backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{LockClient, MemoryBackend};
///
/// let client = LockClient::new(MemoryBackend::new());
/// let guard = client.lock("reports/daily").ttl(Duration::from_secs(10)).await?;
/// // Refused at once while held: waiting is opt-in per request.
/// assert!(client.try_lock("reports/daily").await.is_err());
/// assert!(guard.release().await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockClient {
    backend: DynBackend,
    defaults: AcquireOptions,
}

impl LockClient {
    /// A client over `backend` with default options.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_dyn(Arc::new(backend))
    }

    /// A client over an already shared backend.
    pub fn from_dyn(backend: DynBackend) -> Self {
        LockClient {
            backend,
            defaults: AcquireOptions::default(),
        }
    }

    /// Replaces the options requests start from.
    pub fn with_defaults(mut self, defaults: AcquireOptions) -> Self {
        self.defaults = defaults;
        self
    }

    /// The options requests start from.
    pub fn defaults(&self) -> &AcquireOptions {
        &self.defaults
    }

    /// The backend underneath.
    pub fn backend(&self) -> &DynBackend {
        &self.backend
    }

    /// A request for `key` with this client's default options, to refine and `.await`.
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        LockRequest {
            client: self,
            owner: None,
            key: LockKey::new(key),
            options: self.defaults.clone(),
        }
    }

    /// A request for `key` that does not wait: a held key is [`ErrorKind::HeldByAnother`].
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        self.lock(key).no_wait()
    }

    /// Who holds `key` right now.
    pub async fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>> {
        let key = LockKey::new(key)?;
        crate::backend::with_timeout(
            self.defaults.request_timeout,
            "inspect",
            self.backend.inspect(&key),
        )
        .await
    }

    /// A reentrant owner: locks taken through it (and its clones) can be taken again
    /// while held, and are given back to the store only by the outermost release.
    pub fn owner(&self) -> LockOwner {
        LockOwner::new(self.clone())
    }

    pub(crate) async fn acquire_guard(
        &self,
        key: LockKey,
        options: AcquireOptions,
    ) -> Result<LockGuard> {
        let (lease, release_again) = acquire_lease(&self.backend, key, &options).await?;
        Ok(LockGuard::new(
            HeldLock::start(self.backend.clone(), lease, options, release_again),
            None,
        ))
    }
}

/// A lock request: refine it with the builder methods, then `.await` it for a guard.
#[must_use = "a lock request does nothing until awaited"]
#[derive(Debug)]
pub struct LockRequest<'a> {
    client: &'a LockClient,
    owner: Option<&'a LockOwner>,
    key: Result<LockKey>,
    options: AcquireOptions,
}

impl<'a> LockRequest<'a> {
    pub(crate) fn for_owner(
        owner: &'a LockOwner,
        client: &'a LockClient,
        key: Result<LockKey>,
    ) -> Self {
        LockRequest {
            client,
            owner: Some(owner),
            key,
            options: client.defaults.clone(),
        }
    }

    /// How long the store keeps the lease without renewal.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = ttl;
        self
    }

    /// How long to wait for a held key.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.options.wait = wait;
        self
    }

    /// Waits at most `bound`, then fails with [`ErrorKind::TimedOut`].
    pub fn wait_up_to(self, bound: Duration) -> Self {
        self.wait(Wait::UpTo(bound))
    }

    /// Fails at once with [`ErrorKind::HeldByAnother`] if the key is held.
    pub fn no_wait(self) -> Self {
        self.wait(Wait::No)
    }

    /// Who keeps the lease alive.
    pub fn renewal(mut self, renewal: Renewal) -> Self {
        self.options.renewal = renewal;
        self
    }

    /// Replaces every option at once.
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.options = options;
        self
    }
}

impl<'a> IntoFuture for LockRequest<'a> {
    type Output = Result<LockGuard>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<LockGuard>> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let key = self.key?;
            match self.owner {
                Some(owner) => owner.acquire(key, self.options).await,
                None => self.client.acquire_guard(key, self.options).await,
            }
        })
    }
}

fn check_options(backend: &DynBackend, options: &AcquireOptions) -> Result<()> {
    backend.capabilities().check_ttl(options.ttl)?;
    if options.drift_allowance() >= options.ttl {
        return Err(Error::invalid(format!(
            "clock-drift allowance {:?} leaves nothing of the TTL {:?}",
            options.drift_allowance(),
            options.ttl
        )));
    }
    if options.request_timeout.is_zero() {
        return Err(Error::invalid("request timeout is zero"));
    }
    // A zero pause turns waiting into a tight loop against the store.
    if options.backoff.initial.is_zero() || options.backoff.max.is_zero() {
        return Err(Error::invalid(format!(
            "backoff {:?} has a zero pause; waiting would hammer the store",
            options.backoff
        )));
    }
    Ok(())
}

/// Acquires per `options`, making sure an abandoned or failed attempt leaves no hold.
///
/// With the lease comes how long after it ends to release its id once more: when an
/// attempt went unanswered it may still land in the store after the lease was released
/// (a phantom hold of a lease id nobody holds), and a second release a request timeout
/// later removes it.
pub(crate) async fn acquire_lease(
    backend: &DynBackend,
    key: LockKey,
    options: &AcquireOptions,
) -> Result<(Lease, Option<Duration>)> {
    let span = tracing::info_span!(
        "distlock.acquire",
        backend = backend.name(),
        key = %key,
        attempts = tracing::field::Empty,
        wait_ms = tracing::field::Empty,
        token = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    async move {
        check_options(backend, options)?;
        let started = Instant::now();
        let request = AcquireRequest::new(key, options.ttl, options.drift_allowance());
        let mut cleanup = AbandonedAttempt {
            backend: backend.clone(),
            request: Some((request.key().clone(), request.lease_id())),
            timeout: options.request_timeout,
        };
        let result = match options.wait {
            Wait::No => {
                backend
                    .acquire_once(&request, options.request_timeout)
                    .await
            }
            Wait::UpTo(_) | Wait::Forever => {
                let spec = WaitSpec {
                    until: options.wait.deadline_from(started),
                    backoff: options.backoff,
                    request_timeout: options.request_timeout,
                };
                wait_bounded(backend, &request, &spec).await
            }
        };
        let span = tracing::Span::current();
        span.record("wait_ms", started.elapsed().as_millis() as u64);
        span.record("outcome", outcome_name(&result));
        match &result {
            Ok(lease) => {
                span.record("token", lease.token().get());
                cleanup.request = None;
            }
            // A grant whose reply was too late (or lost) and was not found again: release
            // the lease id in case the store has it, and again in case an attempt lands
            // later still.
            // Nothing was sent, or the only attempt got a definite "held": the store holds
            // nothing of ours. After a wait, an early attempt that timed out may still
            // reach the store late, so a failed wait always cleans up.
            Err(err)
                if matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported)
                    || (options.wait == Wait::No && err.kind() == ErrorKind::HeldByAnother) =>
            {
                cleanup.request = None;
            }
            Err(_) => {}
        }
        let release_again = request
            .had_unanswered_attempt()
            .then_some(options.request_timeout);
        result.map(|lease| (lease, release_again))
    }
    .instrument(span)
    .await
}

/// Runs the backend's wait (its own fair queue, or the default polling loop), bounded by
/// the wait so an override that never returns cannot hold a bounded waiter hostage, and
/// retried with the same lease id when the store did not answer: a grant whose reply was
/// lost is then found again instead of left behind.
async fn wait_bounded(
    backend: &DynBackend,
    request: &AcquireRequest,
    spec: &WaitSpec,
) -> Result<Lease> {
    let grace = spec.request_timeout.min(Duration::from_millis(250));
    let mut attempt = 0;
    loop {
        let result = match spec.until {
            None => backend.acquire(request, spec).await,
            Some(until) => {
                let outer = tokio::time::Instant::from_std(saturating_add(until, grace));
                tokio::time::timeout_at(outer, backend.acquire(request, spec))
                    .await
                    .unwrap_or_else(|_| {
                        request.note_unanswered();
                        Err(Error::unavailable(
                            "the store did not answer before the wait ended",
                        ))
                    })
            }
        };
        // A backend's own queue may hand back a grant that was over on arrival too.
        let result = result.and_then(|lease| lease.checked_on_arrival(request));
        match result {
            Err(err) if err.kind() == ErrorKind::Unavailable => {
                request.note_unanswered();
                let pause = spec.backoff.pause(attempt);
                attempt += 1;
                if spec
                    .until
                    .is_some_and(|until| saturating_add(Instant::now(), pause) >= until)
                {
                    return Err(err);
                }
                tracing::debug!(error = %err, "store unavailable while waiting; retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// Releases a request's lease id if the acquisition future is dropped or fails in a way
/// that leaves it unknown whether the store granted it.
struct AbandonedAttempt {
    backend: DynBackend,
    request: Option<(LockKey, LeaseId)>,
    timeout: Duration,
}

impl Drop for AbandonedAttempt {
    fn drop(&mut self) {
        if let Some((key, lease_id)) = self.request.take() {
            // Any attempt still on its way lands within about a request timeout.
            spawn_release(
                self.backend.clone(),
                key,
                lease_id,
                self.timeout,
                &[Duration::ZERO, self.timeout],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{KeyWatch, LockInfo};
    use crate::capabilities::Capabilities;
    use crate::lease::FencingToken;
    use crate::MemoryBackend;

    /// A store reached over a slow link: each acquisition lands 50 ms after it was sent,
    /// whether or not the caller still waits for the reply.
    #[derive(Debug)]
    struct LateLanding(MemoryBackend);

    #[async_trait::async_trait]
    impl LockBackend for LateLanding {
        fn name(&self) -> &'static str {
            "late-landing"
        }
        fn capabilities(&self) -> &Capabilities {
            self.0.capabilities()
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<FencingToken>> {
            let (store, request) = (self.0.clone(), request.clone());
            let landing = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                store.try_acquire(&request).await
            });
            landing
                .await
                .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?
        }
        async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool> {
            self.0.renew(key, lease_id, ttl).await
        }
        async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
            self.0.release(key, lease_id).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
            self.0.inspect(key).await
        }
        async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
            self.0.watch(key).await
        }
    }

    #[tokio::test]
    async fn an_acquisition_landing_after_its_cleanup_is_released_again() {
        let store = MemoryBackend::new();
        let client = LockClient::new(LateLanding(store.clone())).with_defaults(AcquireOptions {
            ttl: Duration::from_secs(60),
            request_timeout: Duration::from_millis(200),
            ..AcquireOptions::default()
        });
        // Given up before the request lands: the first clean-up release finds nothing.
        let abandoned = tokio::time::timeout(
            Duration::from_millis(10),
            client.try_lock("k").into_future(),
        )
        .await;
        assert!(abandoned.is_err());
        let key = LockKey::new("k").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen_held = false;
        loop {
            let held = store.inspect(&key).await.unwrap().is_some();
            seen_held |= held;
            if seen_held && !held {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the late grant was never released (seen held: {seen_held})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
