//! One acquisition, from options to a held lease, leaving no hold behind when it fails or
//! is abandoned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backend::{AcquireRequest, DynBackend, LockBackendExt};
use crate::engine::cleanup::{Cleanup, CleanupOf};
use crate::engine::held::HeldLock;
use crate::engine::local::Handoff;
use crate::engine::{outcome_name, ClientCore};
use crate::observe;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::Lease;
use crate::values::options::{AcquireOptions, LeaseSharing, Wait, WaitSpec};

/// How a granted hold lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keeping {
    /// By its renewals, or its session, as its options say.
    Renewed,
    /// By its TTL alone, judged by the store's clock ([`AcquireRequest::detached`]).
    Detached,
}

/// Acquires `key` per `options` and hands the lease to the client's renewal engine.
///
/// The client's tasks that want the same key first line up locally, and only the one
/// at the head talks to the store; the wait bound covers both waits.
pub(crate) async fn acquire_held(
    core: &Arc<ClientCore>,
    key: LockKey,
    options: AcquireOptions,
    keeping: Keeping,
) -> Result<Arc<HeldLock>> {
    let started = crate::values::clock::now();
    let backend = core.backend.name();
    // Counted while it waits, in the local line or at the store (cancellation included).
    let _waiter = (options.wait != Wait::No).then(|| observe::Waiter::count(backend));
    let held = acquire_counted(core, key, options, keeping, started).await;
    observe::acquired(backend, outcome_name(&held), started);
    held
}

async fn acquire_counted(
    core: &Arc<ClientCore>,
    key: LockKey,
    options: AcquireOptions,
    keeping: Keeping,
    started: Instant,
) -> Result<Arc<HeldLock>> {
    core.refuse_if_shut_down()?;
    core.backend
        .capabilities()
        .check_kind(core.backend.name(), &key)?;
    check_options(&core.backend, &options)?;
    let line = tracing::debug_span!(
        "distlock.wait",
        backend = core.backend.name(),
        key = %key,
        line = "local",
        outcome = tracing::field::Empty
    );
    let entered = core
        .local
        .enter(&key, options.wait, started)
        .instrument(line.clone())
        .await;
    line.record("outcome", outcome_name(&entered));
    let mut turn = entered?;
    if let Some(handed) = turn.take_handed() {
        if options.lease_sharing == LeaseSharing::SharedWithLocalWaiters && handed.lease.is_valid()
        {
            tracing::debug!(%key, token = %handed.lease.token(), "lease handed over locally");
            return HeldLock::start_unless_shut_down(core, handed.lease, options, None, Some(turn))
                .await;
        }
        // Not wanted here (or run out meanwhile): the store gets it back first, so this
        // task's own attempt does not find the key held by a lease nobody holds. Should
        // this task be cancelled meanwhile, or the release fail, the background does it.
        let mut giving_back = GivingBack(Some(handed));
        if let Some(handed) = &giving_back.0 {
            let released = handed
                .backend
                .release_lease(&handed.lease, handed.request_timeout)
                .await;
            if released.is_ok() {
                giving_back.0 = None;
            }
        }
    }
    let remote = AcquireOptions {
        wait: options.wait.remaining_from(started),
        ..options.clone()
    };
    // The local line took the whole wait: going to the store now, even for one attempt,
    // would end the wait a request time-out past its bound.
    if remote.wait == Wait::UpTo(Duration::ZERO) && options.wait != remote.wait {
        return Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "{:?} stayed held by this client's other tasks for the whole wait",
                key.as_str()
            ),
        ));
    }
    let (lease, release_again) = acquire_lease(&core.backend, key, &remote, keeping).await?;
    HeldLock::start_unless_shut_down(core, lease, options, release_again, Some(turn)).await
}

pub(crate) fn check_options(backend: &DynBackend, options: &AcquireOptions) -> Result<()> {
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
async fn acquire_lease(
    backend: &DynBackend,
    key: LockKey,
    options: &AcquireOptions,
    keeping: Keeping,
) -> Result<(Lease, Option<Duration>)> {
    let span = tracing::info_span!(
        "distlock.acquire",
        backend = backend.name(),
        key = %key,
        lease = tracing::field::Empty,
        wait_ms = tracing::field::Empty,
        token = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    async move {
        let started = crate::values::clock::now();
        let request =
            AcquireRequest::new(key, options.ttl, options.drift_allowance(), options.renewal)
                .with_holder_label(options.holder_label.clone())
                .waiting(!matches!(
                    options.wait,
                    Wait::No | Wait::UpTo(Duration::ZERO)
                ))
                .for_store(backend.capabilities());
        let request = match keeping {
            Keeping::Renewed => request,
            Keeping::Detached => request.detached(),
        };
        let span = tracing::Span::current();
        // Formatting the id costs more than the rest of an uncontended acquire's
        // bookkeeping: only for a span someone records.
        if !span.is_disabled() {
            span.record(
                "lease",
                tracing::field::display(observe::lease_prefix(request.lease_id())),
            );
        }
        let mut cleanup = AbandonedAttempt {
            backend: backend.clone(),
            request: request.clone(),
            release: Some(CleanupOf {
                what: Cleanup::Release,
                key: request.key().clone(),
                lease_id: request.lease_id(),
                timeout: options.request_timeout,
                ttl: options.ttl,
            }),
        };
        let spec = WaitSpec {
            until: options.wait.deadline_from(started),
            backoff: options.backoff,
            request_timeout: options.request_timeout,
        };
        let result = match options.wait {
            // Never queues, so never jumps a fair queue either: a fair store grants
            // nothing while anyone waits. A wait of zero is such a try too: queueing and
            // leaving again at once could only add round trips.
            Wait::No | Wait::UpTo(Duration::ZERO) => {
                backend
                    .acquire_once(&request, options.request_timeout)
                    .await
            }
            _ => {
                let wait = tracing::debug_span!(
                    "distlock.wait",
                    backend = backend.name(),
                    key = %request.key(),
                    line = "store",
                    attempts = tracing::field::Empty,
                    outcome = tracing::field::Empty,
                );
                let waited = Box::pin(wait_at_store(backend, &request, &spec))
                    .instrument(wait.clone())
                    .await;
                wait.record("outcome", outcome_name(&waited));
                waited
            }
        };
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record(
                "wait_ms",
                crate::values::clock::since(started).as_millis() as u64,
            );
            span.record("outcome", outcome_name(&result));
        }
        match &result {
            Ok(lease) => {
                span.record("token", lease.token().get());
                cleanup.release = None;
            }
            // Nothing was sent, or the only attempt got a definite "held": the store holds
            // nothing of ours. After a wait, an early attempt that timed out may still
            // reach the store late, so a failed wait always cleans up.
            Err(err)
                if matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported)
                    || (matches!(options.wait, Wait::No | Wait::UpTo(Duration::ZERO))
                        && err.kind() == ErrorKind::HeldByAnother) =>
            {
                cleanup.release = None;
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

/// Waits at the store: in its fair queue, or by attempts woken by its notifications (or
/// polls). Boxed by the caller: its state is large, and the common no-wait and
/// first-attempt path should not carry (and move) it.
async fn wait_at_store(
    backend: &DynBackend,
    request: &AcquireRequest,
    spec: &WaitSpec,
) -> Result<Lease> {
    if backend.capabilities().fair_ordering {
        return crate::engine::queue::acquire_in_queue(backend, request, spec).await;
    }
    let subscribing = backend
        .capabilities()
        .native_notification
        .then(|| backend.watch(request.key()));
    crate::engine::poll::wait_for_grant(
        request.key(),
        spec,
        crate::engine::poll::WaitStart {
            wakes: crate::engine::poll::Wakes::Herd,
            store_answered: false,
        },
        subscribing,
        |timeout| backend.acquire_once(request, timeout),
    )
    .await
}

/// A handed-over lease on its way back to the store: released in the background unless
/// the task's own release was answered.
struct GivingBack(Option<Handoff>);

impl Drop for GivingBack {
    fn drop(&mut self) {
        if let Some(handed) = self.0.take() {
            handed.release();
        }
    }
}

/// Releases a request's lease id if the acquisition future is dropped or fails in a way
/// that leaves it unknown whether the store granted it.
struct AbandonedAttempt {
    backend: DynBackend,
    request: AcquireRequest,
    release: Option<CleanupOf>,
}

impl Drop for AbandonedAttempt {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            // An attempt still on its way lands within about a request timeout; with none
            // (a wait cancelled between attempts) one release is all it takes.
            let again = self.request.may_land_late().then_some(release.timeout);
            let schedule: Vec<Duration> = std::iter::once(Duration::ZERO).chain(again).collect();
            release.spawn(&self.backend, &schedule);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{
        Capabilities, Grant, HolderInfo, KeyWatch, LockBackend, Ownership, ReleaseFeed,
    };
    use crate::values::lease::LeaseId;
    use crate::{AcquireOptions, LockClient, MemoryBackend};
    use std::future::IntoFuture;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The memory store behind a link whose acquisitions land `land_after` after they
    /// were sent (whether or not the caller still waits for the reply), announcing
    /// releases through a feed the test can also wake by hand; it counts attempts.
    #[derive(Debug)]
    struct TestLink {
        store: MemoryBackend,
        land_after: Duration,
        feed: ReleaseFeed,
        attempts: AtomicU64,
        releases: AtomicU64,
    }

    impl TestLink {
        fn new(store: MemoryBackend, land_after: Duration) -> Arc<Self> {
            Arc::new(TestLink {
                store,
                land_after,
                feed: ReleaseFeed::new(),
                attempts: AtomicU64::new(0),
                releases: AtomicU64::new(0),
            })
        }
    }

    #[async_trait::async_trait]
    impl LockBackend for TestLink {
        fn name(&self) -> &'static str {
            "test-link"
        }
        fn capabilities(&self) -> &Capabilities {
            self.store.capabilities()
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let (store, request, delay) = (self.store.clone(), request.clone(), self.land_after);
            let landing = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                store.try_acquire(&request).await
            });
            landing
                .await
                .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?
        }
        async fn renew(
            &self,
            key: &LockKey,
            lease_id: LeaseId,
            ttl: Duration,
        ) -> Result<Ownership> {
            self.store.renew(key, lease_id, ttl).await
        }
        async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            let released = self.store.release(key, lease_id).await;
            self.feed.released(key.as_str());
            released
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
            self.store.inspect(key).await
        }
        async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
            Ok(Some(self.feed.watch(key.as_str())))
        }
    }

    /// "Look again" wake-ups (a listener that re-subscribed) that find the key still held
    /// are not contention: the waiter acts on the next release at once, not after a
    /// backoff pause.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn look_again_wake_ups_do_not_delay_the_next_release() {
        let link = TestLink::new(MemoryBackend::new(), Duration::ZERO);
        let holder = LockClient::new(link.clone());
        // Pauses after contended wake-ups, and the fallback poll, would both be seconds.
        let waiter = LockClient::new(link.clone()).with_defaults(AcquireOptions {
            backoff: crate::Backoff {
                initial: Duration::from_secs(5),
                max: Duration::from_secs(10),
            },
            ..AcquireOptions::default()
        });
        for round in 0..3 {
            let guard = holder.lock("k").await.unwrap();
            let before = link.attempts.load(Ordering::SeqCst);
            let waiting = tokio::spawn(waiter.lock("k").into_future());
            for wake in 1..=3 {
                wait_until(|| link.attempts.load(Ordering::SeqCst) >= before + wake).await;
                link.feed.wake_all();
            }
            wait_until(|| link.attempts.load(Ordering::SeqCst) >= before + 4).await;
            let released = crate::values::clock::now();
            guard.release().await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(1), waiting)
                .await
                .unwrap_or_else(|_| panic!("round {round}: the release was not acted on at once"))
                .unwrap()
                .unwrap();
            assert!(released.elapsed() < Duration::from_secs(1));
            got.release().await.unwrap();
        }
    }

    async fn wait_until(mut check: impl FnMut() -> bool) {
        let deadline = crate::values::clock::now() + Duration::from_secs(5);
        while !check() {
            assert!(
                crate::values::clock::now() < deadline,
                "not true within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The memory store behind a link whose releases take `slow` to be answered (the
    /// store applies them only then, so a dropped release never lands).
    #[derive(Debug)]
    struct SlowRelease {
        store: MemoryBackend,
        slow: Duration,
        /// Releases that have reached the link.
        releasing: AtomicU64,
    }

    #[async_trait::async_trait]
    impl LockBackend for SlowRelease {
        fn name(&self) -> &'static str {
            "slow-release"
        }
        fn capabilities(&self) -> &Capabilities {
            self.store.capabilities()
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
            self.store.try_acquire(request).await
        }
        async fn renew(
            &self,
            key: &LockKey,
            lease_id: LeaseId,
            ttl: Duration,
        ) -> Result<Ownership> {
            self.store.renew(key, lease_id, ttl).await
        }
        async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
            self.releasing.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.slow).await;
            self.store.release(key, lease_id).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
            self.store.inspect(key).await
        }
    }

    /// A task that is handed a lease it did not opt into gives it back to the store; if
    /// it is cancelled while doing so, the lease is still given back (in the background),
    /// not left held for its TTL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handed_lease_given_back_by_a_cancelled_task_is_released() {
        let store = MemoryBackend::new();
        let slow = Duration::from_millis(200);
        let link = Arc::new(SlowRelease {
            store: store.clone(),
            slow,
            releasing: AtomicU64::new(0),
        });
        let client = LockClient::new(link.clone()).with_defaults(AcquireOptions {
            ttl: Duration::from_secs(60),
            ..AcquireOptions::default()
        });
        let holder = client
            .lock("k")
            .share_lease_with_local_waiters()
            .await
            .unwrap();
        // Waits in the client's local line without opting into the handoff.
        let receiver = tokio::spawn(
            client
                .lock("k")
                .lease_sharing(LeaseSharing::OwnLease)
                .into_future(),
        );
        wait_until(|| client.local_waiters("k") == 1).await;
        // Handed over locally, so no store call: the receiver now gives it back (slowly).
        holder.release().await.unwrap();
        // The receiver is giving the lease back: cancel it mid-release.
        wait_until(|| link.releasing.load(Ordering::SeqCst) == 1).await;
        receiver.abort();
        let key = LockKey::new("k").unwrap();
        let deadline = crate::values::clock::now() + Duration::from_secs(5);
        while store.inspect(&key).await.unwrap().is_some() {
            assert!(
                crate::values::clock::now() < deadline,
                "the handed lease stayed held after its receiver was cancelled"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A wait cancelled between attempts has nothing on its way to the store: one release
    /// cleans up, without a second one a request timeout later (which a process exiting
    /// after Ctrl-C would otherwise wait for or cut off). Cancelled mid-attempt, the second
    /// release still follows.
    #[tokio::test]
    async fn only_an_attempt_on_its_way_gets_a_second_release() {
        let store = MemoryBackend::new();
        let holder = LockClient::new(store.clone());
        let _held = holder.lock("k").await.unwrap();
        let request_timeout = Duration::from_millis(200);
        for (land_after, cancel_after, expected) in [
            // Attempts answered at once; cancelled while waiting for the next poll.
            (Duration::ZERO, Duration::from_millis(50), 1),
            // Cancelled while an attempt is on its way.
            (Duration::from_millis(100), Duration::from_millis(50), 2),
        ] {
            let link = TestLink::new(store.clone(), land_after);
            let client = LockClient::new(link.clone()).with_defaults(AcquireOptions {
                request_timeout,
                backoff: crate::Backoff {
                    initial: Duration::from_secs(1),
                    max: Duration::from_secs(1),
                },
                ..AcquireOptions::default()
            });
            let waiting = client.lock("k").into_future();
            assert!(tokio::time::timeout(cancel_after, waiting).await.is_err());
            tokio::time::sleep(request_timeout * 3).await;
            assert_eq!(
                link.releases.load(Ordering::SeqCst),
                expected,
                "attempts landing after {land_after:?}, cancelled after {cancel_after:?}"
            );
        }
    }

    #[tokio::test]
    async fn an_acquisition_landing_after_its_cleanup_is_released_again() {
        let store = MemoryBackend::new();
        let link = TestLink::new(store.clone(), Duration::from_millis(50));
        let client = LockClient::new(link).with_defaults(AcquireOptions {
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
        let deadline = crate::values::clock::now() + Duration::from_secs(5);
        let mut seen_held = false;
        loop {
            let held = store.inspect(&key).await.unwrap().is_some();
            seen_held |= held;
            if seen_held && !held {
                break;
            }
            assert!(
                crate::values::clock::now() < deadline,
                "the late grant was never released (seen held: {seen_held})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
