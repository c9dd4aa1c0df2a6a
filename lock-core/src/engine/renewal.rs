//! One renewal engine per client: a single task keeps every held lease of the client alive
//! and marks each lost at its deadline, whatever the backend's [`Liveness`].
//!
//! - Per-lease and batched backends: the engine wakes when leases are due (a third of the
//!   TTL after the request that last proved them alive was sent), takes every lease due
//!   within the next sixth of its TTL along, and renews them with one
//!   [`renew_many`](crate::backend::LockBackend::renew_many) call, so leases drift into
//!   step and a batched store sees O(1) round trips per interval.
//! - Session backends: the engine follows each session's status. An answered keep-alive
//!   moves the deadline of every lease of the session to its send time plus the session
//!   TTL minus the drift allowance (a proof the session's status carries moves it even
//!   while later keep-alives go unanswered); a disconnected session suspends its leases
//!   and moves nothing more; an expired one makes all its leases lost at once.
//!
//! Either way a lease whose deadline passes is lost. Ten thousand held guards cost this one
//! task, plus one per session and one per renewal call in flight.
//!
//! [`Liveness`]: crate::backend::Liveness

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::backend::{lock_unpoisoned, with_timeout, DynBackend, LeaseRenewal, Ownership, Session};
use crate::defects::{self, CoreDefect};
use crate::engine::held::{HeldLock, LossReason, Status};
use crate::observe;
use crate::values::error::{ErrorKind, Result};
use crate::values::lease::Lease;
use crate::values::options::Renewal;

/// Leases renewed by one call at most, so no request grows without bound.
const MAX_BATCH: usize = 1000;

/// Leases and events handed to the engine without waking it: it looks at the inbox
/// whenever it wakes, and is woken only when something needs it sooner than its next
/// wake-up (or the inbox grows long), so taking and releasing locks costs no task switch.
#[derive(Debug, Default)]
struct Inbox {
    added: Vec<Weak<HeldLock>>,
    finished: Vec<u64>,
    sessions: Vec<u64>,
    /// An engine task is running for this client.
    running: bool,
    /// The engine was woken for what is here and will look at it at once.
    woken: bool,
}

impl Inbox {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.finished.is_empty() && self.sessions.is_empty()
    }

    fn len(&self) -> usize {
        self.added.len() + self.finished.len() + self.sessions.len()
    }
}

/// Inbox entries that wake the engine however late they are due, so the inbox stays small.
const INBOX_WAKE: usize = 1024;

#[derive(Debug)]
struct Shared {
    inbox: Mutex<Inbox>,
    wake: Notify,
    /// The engine's next wake-up in nanoseconds after `epoch`; 0 while it is awake and
    /// will look at the inbox again before it sleeps.
    next_wake: AtomicU64,
    epoch: Instant,
    /// The client is gone: the engine ends once it tracks nothing.
    closed: AtomicBool,
}

impl Shared {
    fn at(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Posts to the inbox; wakes the engine if its next wake-up would be too late for
    /// `due` (once: a woken engine looks at everything posted until it drains the inbox).
    fn post(&self, due: Option<Instant>, post: impl FnOnce(&mut Inbox)) {
        let wake = {
            let mut inbox = lock_unpoisoned(&self.inbox);
            post(&mut inbox);
            let too_late =
                due.is_some_and(|due| self.at(due) < self.next_wake.load(Ordering::SeqCst));
            let wake = !inbox.woken && (too_late || inbox.len() >= INBOX_WAKE);
            inbox.woken |= wake;
            wake
        };
        if wake {
            self.wake.notify_one();
        }
    }
}

/// A client's handle on its renewal engine, started with the first held lease.
#[derive(Debug)]
pub(crate) struct Renewals {
    backend: DynBackend,
    shared: Arc<Shared>,
}

impl Drop for Renewals {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

impl Renewals {
    pub(crate) fn new(backend: DynBackend) -> Self {
        Renewals {
            backend,
            shared: Arc::new(Shared {
                inbox: Mutex::default(),
                wake: Notify::new(),
                next_wake: AtomicU64::new(0),
                epoch: crate::values::clock::now(),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Hands a new lease to the engine, starting it on this runtime if it is not running
    /// (the first lease, or the runtime it ran on has shut down).
    pub(crate) fn track(&self, held: Arc<HeldLock>) {
        let lease = held.lease();
        let due = renew_at(&held, &lease).unwrap_or(lease.valid_until());
        let start = {
            let mut inbox = lock_unpoisoned(&self.shared.inbox);
            if inbox.running {
                false
            } else {
                inbox.added.push(Arc::downgrade(&held));
                inbox.running = true;
                true
            }
        };
        if !start {
            self.shared
                .post(Some(due), |inbox| inbox.added.push(Arc::downgrade(&held)));
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let mut inbox = lock_unpoisoned(&self.shared.inbox);
            inbox.running = false;
            inbox.added.clear();
            tracing::warn!(key = %held.key, "no tokio runtime: the lease is not renewed and will be lost at its deadline");
            return;
        };
        let engine = Engine {
            backend: self.backend.clone(),
            shared: Arc::clone(&self.shared),
            tracked: HashMap::new(),
            schedule: BTreeSet::new(),
            sessions: HashMap::new(),
            renewing: JoinSet::new(),
        };
        runtime.spawn(engine.run());
    }

    /// The lease was released: the engine forgets it when it next looks.
    pub(crate) fn finished(&self, id: u64) {
        self.shared.post(None, |inbox| inbox.finished.push(id));
    }
}

/// The engine holds leases weakly: a lease nobody holds any more (its guard released or
/// dropped) must not keep its client, and the client's connections, alive.
struct Tracked {
    held: Weak<HeldLock>,
    /// When the engine looks at the lease next (its entry in the schedule).
    wake: Instant,
    /// Failed renewal attempts in a row, and when to retry.
    attempt: u32,
    retry_at: Option<Instant>,
    renewing: bool,
}

struct TrackedSession {
    session: Session,
    leases: Vec<u64>,
    follower: AbortHandle,
}

impl Drop for TrackedSession {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

struct Renewed {
    sent_at: Instant,
    leases: Vec<(u64, Lease)>,
    results: Vec<Result<Ownership>>,
}

struct Engine {
    backend: DynBackend,
    shared: Arc<Shared>,
    tracked: HashMap<u64, Tracked>,
    schedule: BTreeSet<(Instant, u64)>,
    sessions: HashMap<u64, TrackedSession>,
    renewing: JoinSet<Renewed>,
}

/// Lets a later `track` start a new engine when this one ends (the client is gone, or the
/// runtime it ran on shut down).
impl Drop for Engine {
    fn drop(&mut self) {
        lock_unpoisoned(&self.shared.inbox).running = false;
    }
}

impl Engine {
    async fn run(mut self) {
        loop {
            self.shared.next_wake.store(0, Ordering::SeqCst);
            let (added, finished, sessions) = {
                let mut inbox = lock_unpoisoned(&self.shared.inbox);
                inbox.woken = false;
                (
                    std::mem::take(&mut inbox.added),
                    std::mem::take(&mut inbox.finished),
                    std::mem::take(&mut inbox.sessions),
                )
            };
            for held in added {
                if let Some(held) = held.upgrade() {
                    self.track(held);
                }
            }
            for id in finished {
                self.forget(id);
            }
            for id in sessions {
                self.session_changed(id);
            }
            let closed = self.shared.closed.load(Ordering::SeqCst);
            if closed {
                self.tracked
                    .retain(|_, tracked| tracked.held.strong_count() > 0);
            }
            if closed && self.tracked.is_empty() {
                return;
            }
            self.due(crate::values::clock::now());
            let next = self.schedule.first().map(|(at, _)| *at);
            let next_wake = next.map_or(u64::MAX, |at| self.shared.at(at));
            self.shared.next_wake.store(next_wake, Ordering::SeqCst);
            if !lock_unpoisoned(&self.shared.inbox).is_empty() {
                continue;
            }
            let sleep = sleep_until(TokioInstant::from_std(next.unwrap_or_else(far_future)));
            tokio::select! {
                () = self.shared.wake.notified() => {}
                Some(done) = self.renewing.join_next(), if !self.renewing.is_empty() => {
                    if let Ok(renewed) = done {
                        self.renewed(renewed);
                    }
                }
                () = sleep, if next.is_some() => {}
            }
        }
    }

    fn track(&mut self, held: Arc<HeldLock>) {
        let id = held.id;
        if let Some(session) = held.lease().session().cloned() {
            self.follow(session, id);
        }
        self.tracked.insert(
            id,
            Tracked {
                held: Arc::downgrade(&held),
                wake: crate::values::clock::now(),
                attempt: 0,
                retry_at: None,
                renewing: false,
            },
        );
        self.reschedule(id);
    }

    /// Follows a session's status changes (one small task per session, not per lease).
    fn follow(&mut self, session: Session, lease: u64) {
        if let Some(tracked) = self.sessions.get_mut(&session.id()) {
            tracked.leases.push(lease);
            return;
        }
        let (id, shared) = (session.id(), Arc::downgrade(&self.shared));
        let mut changes = session.clone();
        let follower = tokio::spawn(async move {
            loop {
                let alive = changes.changed().await;
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                shared.post(Some(crate::values::clock::now()), |inbox| {
                    inbox.sessions.push(id)
                });
                if !alive {
                    return;
                }
            }
        });
        self.sessions.insert(
            id,
            TrackedSession {
                session,
                leases: vec![lease],
                follower: follower.abort_handle(),
            },
        );
    }

    fn session_changed(&mut self, session_id: u64) {
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return;
        };
        let status = session.session.status();
        session.leases.retain(|id| self.tracked.contains_key(id));
        let leases = session.leases.clone();
        if leases.is_empty() {
            self.sessions.remove(&session_id);
            return;
        }
        for id in leases {
            let Some(held) = self.held(id) else {
                continue;
            };
            if status.expired {
                held.mark_lost(
                    LossReason::SessionEnded,
                    "the store ended the lease's session",
                );
            } else {
                // A keep-alive answered is a proof from its send whatever came after it
                // (another one still unanswered, say), so it moves the deadline.
                if let Some(lease) = held.lease().proven_by(&status) {
                    held.renewed(lease);
                }
                if status.disconnected {
                    held.suspended();
                }
            }
            self.reschedule(id);
        }
        if status.expired {
            self.sessions.remove(&session_id);
        }
    }

    /// Puts a lease back in the schedule at its next moment of interest, or forgets it
    /// when it is no longer held (or lost at its deadline).
    fn reschedule(&mut self, id: u64) {
        let Some(held) = self.held(id) else {
            self.forget(id);
            return;
        };
        let Some(tracked) = self.tracked.get_mut(&id) else {
            return;
        };
        self.schedule.remove(&(tracked.wake, id));
        let state = held.snapshot();
        if state.status != Status::Held {
            self.forget(id);
            return;
        }
        let lease = state.lease;
        let deadline = lease.valid_until();
        let now = crate::values::clock::now();
        if now >= deadline && defects::active(CoreDefect::NoLossAtDeadline) {
            self.forget(id);
            return;
        }
        if now >= deadline {
            held.mark_lost(
                LossReason::DeadlinePassed,
                "the local deadline passed without a renewal",
            );
            self.forget(id);
            return;
        }
        let cap = held.hold_cap();
        if cap.is_some_and(|cap| now >= cap) {
            held.mark_lost(LossReason::HoldCapReached, "the hold reached max_hold");
            self.forget(id);
            return;
        }
        let wake = match renew_at(&held, &lease) {
            Some(_) if tracked.renewing => deadline,
            Some(renew_at) => tracked.retry_at.unwrap_or(renew_at).min(deadline),
            None => deadline,
        };
        let wake = cap.map_or(wake, |cap| wake.min(cap));
        tracked.wake = wake;
        self.schedule.insert((wake, id));
    }

    /// The lease, if anyone still holds it.
    fn held(&self, id: u64) -> Option<Arc<HeldLock>> {
        self.tracked.get(&id)?.held.upgrade()
    }

    fn forget(&mut self, id: u64) {
        if let Some(tracked) = self.tracked.remove(&id) {
            self.schedule.remove(&(tracked.wake, id));
        }
    }

    /// Handles every lease whose moment has come, renewing together all that are due now
    /// or within a sixth of their TTL.
    fn due(&mut self, now: Instant) {
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.schedule.first() {
            if at > now {
                break;
            }
            self.schedule.pop_first();
            due.push(id);
        }
        let mut batch = Vec::new();
        for id in due {
            if self.wants_renewal(id, now, Duration::ZERO) {
                batch.push(id);
            } else {
                self.reschedule(id);
            }
        }
        if batch.is_empty() {
            return;
        }
        // Leases due soon go along, so they fall into step with this batch.
        let horizon = now + Duration::from_secs(10);
        let soon: Vec<u64> = self
            .schedule
            .iter()
            .take_while(|(at, _)| *at <= horizon)
            .map(|(_, id)| *id)
            .collect();
        for id in soon {
            let early = self
                .held(id)
                .map_or(Duration::ZERO, |held| held.options.ttl / 6);
            if self.wants_renewal(id, now, early) {
                if let Some(tracked) = self.tracked.get(&id) {
                    self.schedule.remove(&(tracked.wake, id));
                }
                batch.push(id);
            }
        }
        for chunk in batch.chunks(MAX_BATCH) {
            self.send(chunk);
        }
    }

    /// Whether the lease should be renewed now (its renewal or retry moment is no later
    /// than `now + early`).
    fn wants_renewal(&self, id: u64, now: Instant, early: Duration) -> bool {
        let Some(tracked) = self.tracked.get(&id) else {
            return false;
        };
        let Some(held) = tracked.held.upgrade() else {
            return false;
        };
        if tracked.renewing {
            return false;
        }
        let state = held.snapshot();
        if state.status != Status::Held || !state.lease.is_valid() {
            return false;
        }
        match renew_at(&held, &state.lease) {
            Some(at) => tracked.retry_at.unwrap_or(at) <= now + early,
            None => false,
        }
    }

    fn send(&mut self, ids: &[u64]) {
        let mut leases = Vec::with_capacity(ids.len());
        let mut timeout = Duration::MAX;
        for id in ids {
            let Some(tracked) = self.tracked.get_mut(id) else {
                continue;
            };
            let Some(held) = tracked.held.upgrade() else {
                continue;
            };
            tracked.renewing = true;
            let lease = held.lease();
            // Bounded by the request time-out only: one short or nearly expired lease must
            // not cut the call short for the whole batch. A reply that comes after a
            // lease's own deadline is not credited to it (see `renewed`).
            timeout = timeout.min(held.options.request_timeout);
            leases.push((*id, lease, held.options.ttl));
        }
        for id in ids {
            self.reschedule(*id);
        }
        let items: Vec<LeaseRenewal> = leases
            .iter()
            .map(|(_, lease, ttl)| LeaseRenewal {
                key: lease.key().clone(),
                lease_id: lease.id(),
                ttl: self.backend.capabilities().store_ttl(*ttl),
            })
            .collect();
        let leases = leases
            .into_iter()
            .map(|(id, lease, _)| (id, lease))
            .collect();
        let backend = self.backend.clone();
        let timeout = timeout.max(Duration::from_millis(1));
        let span = tracing::debug_span!(
            "distlock.renew_batch",
            backend = backend.name(),
            leases = items.len(),
            outcome = tracing::field::Empty
        );
        let call = async move {
            let sent_at = crate::values::clock::now();
            let answer = with_timeout(backend.name(), timeout, "renew", async {
                Ok(backend.renew_many(&items).await)
            })
            .await;
            observe::renewal_call(backend.name(), crate::values::clock::since(sent_at));
            tracing::Span::current().record("outcome", crate::engine::outcome_name(&answer));
            let results = match answer {
                Ok(results) if results.len() == items.len() => results,
                Ok(results) => {
                    let err = crate::Error::new(
                        ErrorKind::Internal,
                        format!(
                            "the backend answered {} renewals for {}",
                            results.len(),
                            items.len()
                        ),
                    );
                    vec![Err(err); items.len()]
                }
                Err(err) => vec![Err(err); items.len()],
            };
            Renewed {
                sent_at,
                leases,
                results,
            }
        };
        self.renewing
            .spawn(tracing::Instrument::instrument(call, span));
    }

    fn renewed(&mut self, renewed: Renewed) {
        let now = crate::values::clock::now();
        for ((id, lease), result) in renewed.leases.into_iter().zip(renewed.results) {
            let Some(tracked) = self.tracked.get_mut(&id) else {
                continue;
            };
            tracked.renewing = false;
            let Some(held) = tracked.held.upgrade() else {
                continue;
            };
            let span = tracing::info_span!("distlock.renew", backend = self.backend.name(), key = %lease.key(), lease = %observe::lease_prefix(lease.id()), outcome = tracing::field::Empty);
            let _entered = span.enter();
            match result {
                // Answered after the lease's local deadline: too late to count, whatever
                // the store did; the deadline check below marks it lost.
                Ok(Ownership::Held) if !held.lease().is_valid() => {
                    span.record("outcome", "late");
                }
                Ok(Ownership::Held) => {
                    span.record("outcome", "ok");
                    tracked.attempt = 0;
                    tracked.retry_at = None;
                    held.renewed(lease.renewed(held.options.ttl, renewed.sent_at));
                }
                Ok(Ownership::NotHeld) => {
                    span.record("outcome", "lost");
                    held.mark_lost(LossReason::NotHeld, "the store no longer holds the lease");
                }
                Err(err) if err.kind() == ErrorKind::Lost => {
                    span.record("outcome", "lost");
                    held.mark_lost(LossReason::NotHeld, err.message());
                }
                Err(err) => {
                    let outcome = crate::engine::outcome_name::<()>(&Err(err.clone()));
                    span.record("outcome", outcome);
                    observe::renewal_failed(self.backend.name(), outcome);
                    held.suspended();
                    tracing::debug!(error = %err, "renewal failed; retrying until the deadline");
                    let pause = held.options.backoff.pause(tracked.attempt);
                    tracked.attempt = tracked.attempt.saturating_add(1);
                    tracked.retry_at = Some(now + pause);
                }
            }
            drop(_entered);
            self.reschedule(id);
        }
    }
}

/// When an automatically renewed lease is due (a third of its TTL after the request that
/// last proved it alive was sent); `None` when the engine only watches its deadline
/// (manual renewal, or a lease kept alive by its session).
fn renew_at(held: &HeldLock, lease: &Lease) -> Option<Instant> {
    (held.options.renewal == Renewal::Auto && lease.session().is_none())
        .then(|| lease.sent_at() + lease.ttl() / 3)
}

fn far_future() -> Instant {
    crate::values::options::saturating_add(crate::values::clock::now(), Duration::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;

    use crate::backend::{
        lock_unpoisoned, AcquireRequest, Capabilities, Grant, HolderInfo, LeaseRenewal, Liveness,
        LockBackend, Ownership, SessionKeeper,
    };
    use crate::values::error::Result;
    use crate::values::key::LockKey;
    use crate::values::lease::LeaseId;
    use crate::{LockClient, MemoryBackend};

    /// The memory store behind a client that renews in batches (counting the calls) or
    /// keeps leases alive by one session the test steers.
    #[derive(Debug)]
    struct Steered {
        store: MemoryBackend,
        capabilities: Capabilities,
        batches: AtomicU64,
        session: Option<SessionKeeper>,
        /// How long each `renew_many` takes, as on a slow or distant store.
        renew_delay: Duration,
        /// The TTL each request carried, by operation.
        asked: std::sync::Mutex<Vec<(&'static str, Duration)>>,
    }

    impl Steered {
        fn new(liveness: Liveness) -> Self {
            Steered {
                store: MemoryBackend::new(),
                capabilities: Capabilities {
                    liveness,
                    ..MemoryBackend::new().capabilities().clone()
                },
                batches: AtomicU64::new(0),
                session: (liveness == Liveness::Session).then(|| {
                    SessionKeeper::new(crate::values::clock::now(), Duration::from_secs(60))
                }),
                renew_delay: Duration::ZERO,
                asked: Default::default(),
            }
        }

        fn note(&self, what: &'static str, ttl: Duration) {
            lock_unpoisoned(&self.asked).push((what, ttl));
        }

        fn asked(&self, what: &str) -> Vec<Duration> {
            let asked = lock_unpoisoned(&self.asked);
            asked
                .iter()
                .filter(|(op, _)| *op == what)
                .map(|(_, ttl)| *ttl)
                .collect()
        }
    }

    #[async_trait]
    impl LockBackend for Steered {
        fn name(&self) -> &'static str {
            "steered"
        }
        fn capabilities(&self) -> &Capabilities {
            &self.capabilities
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
            self.note("acquire", request.store_ttl());
            let granted = self.store.try_acquire(request).await?;
            Ok(match (granted, &self.session) {
                (Some(grant), Some(session)) => {
                    Some(Grant::in_session(grant.token(), session.session()))
                }
                (granted, _) => granted,
            })
        }
        async fn renew(
            &self,
            key: &LockKey,
            lease_id: LeaseId,
            ttl: Duration,
        ) -> Result<Ownership> {
            self.note("renew", ttl);
            self.store.renew(key, lease_id, ttl).await
        }
        async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
            for lease in leases {
                self.note("renew_many", lease.ttl);
            }
            self.batches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.renew_delay).await;
            self.store.renew_many(leases).await
        }
        async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
            self.store.release(key, lease_id).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
            self.store.inspect(key).await
        }
    }

    /// Short leases that a slow store cannot renew in time do not take the long leases
    /// renewed in the same batch down with them: a batch is bounded by the request
    /// time-out, not by the shortest lease in it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_lease_does_not_cut_a_batch_of_long_ones_short() {
        let backend = Arc::new(Steered {
            renew_delay: Duration::from_millis(80),
            ..Steered::new(Liveness::Batched)
        });
        let client = LockClient::new(backend.clone());
        let mut long = Vec::new();
        for i in 0..100 {
            long.push(
                client
                    .lock(format!("long{i}"))
                    .ttl(Duration::from_millis(1500))
                    .await
                    .unwrap(),
            );
        }
        // Two long TTLs of short leases coming and going, sixty-four at a time, so that some
        // short lease, due with ~65 ms left, is in nearly every batch.
        let churn = crate::values::clock::now();
        let mut churning = Vec::new();
        for task in 0..64 {
            let client = client.clone();
            churning.push(tokio::spawn(async move {
                while churn.elapsed() < Duration::from_secs(4) {
                    let short = client
                        .lock(format!("short{task}"))
                        .ttl(Duration::from_millis(100))
                        .await
                        .unwrap();
                    short.lost().await;
                }
            }));
        }
        for task in churning {
            task.await.unwrap();
        }
        let lost = long.iter().filter(|guard| !guard.is_held()).count();
        assert_eq!(
            lost, 0,
            "{lost} of 100 long leases were lost to short-lease churn"
        );
        for guard in long {
            guard.release().await.unwrap();
        }
    }

    /// Ten thousand automatically renewed guards: one engine task, and a bounded number
    /// of renewal round trips per interval however many leases are due.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_thousand_guards_cost_one_task_and_few_round_trips() {
        let backend = Arc::new(Steered::new(Liveness::Batched));
        let client = LockClient::new(backend.clone());
        let ttl = Duration::from_secs(3);
        let metrics = tokio::runtime::Handle::current().metrics();
        let tasks_before = metrics.num_alive_tasks();
        let mut guards = Vec::new();
        for i in 0..10_000 {
            guards.push(client.lock(format!("k{i}")).ttl(ttl).await.unwrap());
        }
        let tasks_held = metrics.num_alive_tasks();
        assert!(
            tasks_held <= tasks_before + 2,
            "{} tasks for 10,000 guards (before: {tasks_before})",
            tasks_held
        );
        // Two TTLs: every lease is renewed about six times.
        let watched = crate::values::clock::now();
        let batches_before = backend.batches.load(Ordering::SeqCst);
        tokio::time::sleep(ttl * 2).await;
        let batches = backend.batches.load(Ordering::SeqCst) - batches_before;
        assert!(
            guards.iter().all(|g| g.is_held()),
            "a lease was lost while renewed"
        );
        let intervals = (watched.elapsed().as_secs_f64() / (ttl / 3).as_secs_f64()).ceil() as u64;
        // Calls carry at most MAX_BATCH leases each: a bounded number of calls per
        // interval, where renewing one by one would take 10,000.
        let per_round = 10_000u64.div_ceil(super::MAX_BATCH as u64);
        assert!(
            batches <= (2 * intervals + 2) * per_round,
            "{batches} renewal calls in {intervals} intervals for 10,000 leases"
        );
        assert!(batches > 0, "nothing was renewed");
        for guard in guards {
            guard.release().await.unwrap();
        }
    }

    /// A session's keep-alive moves the deadline of all its leases to the keep-alive's
    /// send time; a disconnect moves nothing; its end loses them all at once.
    #[tokio::test]
    async fn leases_follow_their_session() {
        let backend = Arc::new(Steered::new(Liveness::Session));
        let client = LockClient::new(backend.clone());
        let guards: Vec<_> = futures_util::future::join_all((0..3).map(|i| {
            client
                .lock(format!("s{i}"))
                .ttl(Duration::from_secs(60))
                .into_future()
        }))
        .await
        .into_iter()
        .map(|g| g.unwrap())
        .collect();
        let session = backend.session.as_ref().unwrap();
        let sent = crate::values::clock::now();
        session.kept_alive(sent);
        wait_until(|| guards.iter().all(|g| g.lease().sent_at() == sent)).await;
        session.disconnected();
        session.kept_alive(sent - Duration::from_millis(1));
        assert!(guards.iter().all(|g| g.lease().sent_at() == sent));
        session.expired();
        for guard in &guards {
            tokio::time::timeout(Duration::from_secs(5), guard.lost())
                .await
                .expect("a lease outlived its session");
        }
        for guard in guards {
            assert_eq!(
                guard.release().await.unwrap_err().kind(),
                crate::ErrorKind::Lost
            );
        }
    }

    /// A keep-alive answered while a later one already goes unanswered still moves the
    /// deadline: the engine may see both at once, and the proof stands (before, such a
    /// status moved nothing, and leases ran out under a slow but answering store).
    #[tokio::test]
    async fn a_proof_moves_the_deadline_of_a_disconnected_session() {
        let backend = Arc::new(Steered::new(Liveness::Session));
        let client = LockClient::new(backend.clone());
        let guard = client
            .lock("proof-while-disconnected")
            .ttl(Duration::from_secs(60))
            .await
            .unwrap();
        let session = backend.session.as_ref().unwrap();
        let sent = crate::values::clock::now();
        // No await in between: on this one-thread runtime the engine sees only both.
        session.kept_alive(sent);
        session.disconnected();
        wait_until(|| guard.lease().sent_at() == sent).await;
        assert_eq!(guard.health(), crate::LeaseHealth::Suspended);
    }

    /// A released lease does not keep its client (and the client's connections) alive
    /// until the engine's next renewal moment: once the client is gone too, the engine
    /// ends and lets go of the backend.
    #[tokio::test]
    async fn a_dropped_client_with_released_leases_lets_go_of_its_backend() {
        let backend: crate::backend::DynBackend = Arc::new(MemoryBackend::new());
        let alive = Arc::downgrade(&backend);
        let client = LockClient::new(backend);
        for manual in [false, true] {
            let request = client
                .lock(format!("k{manual}"))
                .ttl(Duration::from_secs(60));
            let request = if manual {
                request.renewal(crate::Renewal::Manual)
            } else {
                request
            };
            request.await.unwrap().release().await.unwrap();
        }
        let _dropped_guard = client.lock("dropped").await.unwrap();
        drop(_dropped_guard);
        drop(client);
        wait_until(|| alive.strong_count() == 0).await;
    }

    /// Polls a condition with a deadline (an event with no notification to wait on).
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

    /// The core rounds a TTL up to the store's step once, for every request that carries
    /// one (acquire, manual renewal, batched renewal): a backend never rounds, and never
    /// gets a TTL its store would cut short.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_ttl_reaches_the_store_rounded_up_to_its_step() {
        let mut steered = Steered::new(Liveness::Batched);
        steered.capabilities.ttl_granularity = Duration::from_secs(1);
        let backend = Arc::new(steered);
        let client = LockClient::new(backend.clone());
        let ttl = Duration::from_millis(1500);
        let manual = client
            .lock("rounded/manual")
            .ttl(ttl)
            .renewal(crate::Renewal::Manual)
            .await
            .unwrap();
        manual.renew().await.unwrap();
        let auto = client.lock("rounded/auto").ttl(ttl).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while backend.asked("renew_many").is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a batched renewal within 5 s");
        let two = Duration::from_secs(2);
        assert_eq!(backend.asked("acquire"), vec![two, two]);
        assert_eq!(backend.asked("renew"), vec![two]);
        assert!(backend
            .asked("renew_many")
            .iter()
            .all(|asked| *asked == two));
        manual.release().await.unwrap();
        auto.release().await.unwrap();
    }

    use std::future::IntoFuture;
}
