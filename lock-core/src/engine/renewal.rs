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
//!   TTL minus the drift allowance; a disconnected session moves nothing; an expired one
//!   makes all its leases lost at once.
//!
//! Either way a lease whose deadline passes is lost. Ten thousand held guards cost this one
//! task, plus one per session and one per renewal call in flight.
//!
//! [`Liveness`]: crate::backend::Liveness

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::backend::{lock_unpoisoned, with_timeout, DynBackend, LeaseRenewal, Session};
use crate::engine::held::{HeldLock, Status};
use crate::error::{ErrorKind, Result};
use crate::lease::Lease;
use crate::options::Renewal;

/// Leases renewed by one call at most, so no request grows without bound.
const MAX_BATCH: usize = 1000;

enum Command {
    Track(Arc<HeldLock>),
    SessionChanged(u64),
}

/// A client's handle on its renewal engine, started with the first held lease.
#[derive(Debug)]
pub(crate) struct Renewals {
    backend: DynBackend,
    sender: Mutex<Option<mpsc::UnboundedSender<Command>>>,
}

impl Renewals {
    pub(crate) fn new(backend: DynBackend) -> Self {
        Renewals {
            backend,
            sender: Mutex::new(None),
        }
    }

    /// Hands a new lease to the engine, starting it on this runtime if it is not running
    /// (the first lease, or the runtime it ran on has shut down).
    pub(crate) fn track(&self, held: Arc<HeldLock>) {
        let mut sender = lock_unpoisoned(&self.sender);
        let held = match sender
            .as_ref()
            .map(|tx| tx.send(Command::Track(held.clone())))
        {
            Some(Ok(())) => return,
            _ => held,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %held.key, "no tokio runtime: the lease is not renewed and will be lost at its deadline");
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let engine = Engine {
            backend: self.backend.clone(),
            commands: rx,
            sender: tx.downgrade(),
            tracked: HashMap::new(),
            schedule: BTreeSet::new(),
            sessions: HashMap::new(),
            renewing: JoinSet::new(),
        };
        runtime.spawn(engine.run());
        let _ = tx.send(Command::Track(held));
        *sender = Some(tx);
    }
}

struct Tracked {
    held: Arc<HeldLock>,
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
    results: Vec<Result<bool>>,
}

struct Engine {
    backend: DynBackend,
    commands: mpsc::UnboundedReceiver<Command>,
    sender: mpsc::WeakUnboundedSender<Command>,
    tracked: HashMap<u64, Tracked>,
    schedule: BTreeSet<(Instant, u64)>,
    sessions: HashMap<u64, TrackedSession>,
    renewing: JoinSet<Renewed>,
}

impl Engine {
    async fn run(mut self) {
        loop {
            let next = self.schedule.first().map(|(at, _)| *at);
            tokio::select! {
                command = self.commands.recv() => match command {
                    Some(Command::Track(held)) => self.track(held),
                    Some(Command::SessionChanged(id)) => self.session_changed(id),
                    // Every client handle is gone, and with it every guard.
                    None => return,
                },
                Some(done) = self.renewing.join_next(), if !self.renewing.is_empty() => {
                    if let Ok(renewed) = done {
                        self.renewed(renewed);
                    }
                }
                () = sleep_until(TokioInstant::from_std(next.unwrap_or_else(far_future))), if next.is_some() => {
                    self.due(Instant::now());
                }
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
                held,
                wake: Instant::now(),
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
        let (id, sender) = (session.id(), self.sender.clone());
        let mut changes = session.clone();
        let follower = tokio::spawn(async move {
            loop {
                let alive = changes.changed().await;
                let Some(sender) = sender.upgrade() else {
                    return;
                };
                if sender.send(Command::SessionChanged(id)).is_err() || !alive {
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
            let Some(tracked) = self.tracked.get(&id) else {
                continue;
            };
            if status.expired {
                tracked
                    .held
                    .mark_lost("the store ended the lease's session");
            } else if let Some(lease) = tracked.held.lease().proven_by(&status) {
                tracked.held.renewed(lease);
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
        let Some(tracked) = self.tracked.get_mut(&id) else {
            return;
        };
        self.schedule.remove(&(tracked.wake, id));
        let state = tracked.held.snapshot();
        if state.status != Status::Held {
            self.forget(id);
            return;
        }
        let lease = state.lease;
        let deadline = lease.valid_until();
        if Instant::now() >= deadline {
            tracked
                .held
                .mark_lost("the local deadline passed without a renewal");
            self.forget(id);
            return;
        }
        let wake = match renew_at(&tracked.held, &lease) {
            Some(_) if tracked.renewing => deadline,
            Some(renew_at) => tracked.retry_at.unwrap_or(renew_at).min(deadline),
            None => deadline,
        };
        tracked.wake = wake;
        self.schedule.insert((wake, id));
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
                .tracked
                .get(&id)
                .map_or(Duration::ZERO, |t| t.held.options.ttl / 6);
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
        if tracked.renewing {
            return false;
        }
        let state = tracked.held.snapshot();
        if state.status != Status::Held || !state.lease.is_valid() {
            return false;
        }
        match renew_at(&tracked.held, &state.lease) {
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
            tracked.renewing = true;
            let lease = tracked.held.lease();
            timeout = timeout
                .min(tracked.held.options.request_timeout)
                .min(lease.remaining());
            leases.push((*id, lease, tracked.held.options.ttl));
        }
        for id in ids {
            self.reschedule(*id);
        }
        let items: Vec<LeaseRenewal> = leases
            .iter()
            .map(|(_, lease, ttl)| LeaseRenewal {
                key: lease.key().clone(),
                lease_id: lease.id(),
                ttl: *ttl,
            })
            .collect();
        let leases = leases.into_iter().map(|(id, lease, _)| (id, lease)).collect();
        let backend = self.backend.clone();
        let timeout = timeout.max(Duration::from_millis(1));
        self.renewing.spawn(async move {
            let sent_at = Instant::now();
            let results = match with_timeout(timeout, "renew", async {
                Ok(backend.renew_many(&items).await)
            })
            .await
            {
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
        });
    }

    fn renewed(&mut self, renewed: Renewed) {
        let now = Instant::now();
        for ((id, lease), result) in renewed.leases.into_iter().zip(renewed.results) {
            let Some(tracked) = self.tracked.get_mut(&id) else {
                continue;
            };
            tracked.renewing = false;
            let span = tracing::info_span!("distlock.renew", backend = self.backend.name(), key = %lease.key(), outcome = tracing::field::Empty);
            let _entered = span.enter();
            match result {
                Ok(true) => {
                    span.record("outcome", "ok");
                    tracked.attempt = 0;
                    tracked.retry_at = None;
                    tracked
                        .held
                        .renewed(lease.renewed(tracked.held.options.ttl, renewed.sent_at));
                }
                Ok(false) => {
                    span.record("outcome", "lost");
                    tracked
                        .held
                        .mark_lost("the store no longer holds the lease");
                }
                Err(err) if err.kind() == ErrorKind::Lost => {
                    span.record("outcome", "lost");
                    tracked.held.mark_lost(err.message());
                }
                Err(err) => {
                    span.record(
                        "outcome",
                        crate::engine::outcome_name::<()>(&Err(err.clone())),
                    );
                    tracing::debug!(error = %err, "renewal failed; retrying until the deadline");
                    let pause = tracked.held.options.backoff.pause(tracked.attempt);
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
    crate::options::saturating_add(Instant::now(), Duration::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use async_trait::async_trait;

    use crate::backend::{
        AcquireRequest, Capabilities, Grant, HolderInfo, LeaseRenewal, Liveness, LockBackend,
        SessionKeeper,
    };
    use crate::error::Result;
    use crate::key::LockKey;
    use crate::lease::LeaseId;
    use crate::{LockClient, MemoryBackend};

    /// The memory store behind a client that renews in batches (counting the calls) or
    /// keeps leases alive by one session the test steers.
    #[derive(Debug)]
    struct Steered {
        store: MemoryBackend,
        capabilities: Capabilities,
        batches: AtomicU64,
        session: Option<SessionKeeper>,
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
                session: (liveness == Liveness::Session)
                    .then(|| SessionKeeper::new(Instant::now(), Duration::from_secs(60))),
            }
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
            let granted = self.store.try_acquire(request).await?;
            Ok(match (granted, &self.session) {
                (Some(grant), Some(session)) => {
                    Some(Grant::in_session(grant.token(), session.session()))
                }
                (granted, _) => granted,
            })
        }
        async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool> {
            self.store.renew(key, lease_id, ttl).await
        }
        async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<bool>> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.store.renew_many(leases).await
        }
        async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
            self.store.release(key, lease_id).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
            self.store.inspect(key).await
        }
    }

    /// Ten thousand automatically renewed guards: one engine task, and a bounded number
    /// of renewal round trips per interval however many leases are due.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_thousand_guards_cost_one_task_and_few_round_trips() {
        let backend = Arc::new(Steered::new(Liveness::Batched));
        let client = LockClient::from_dyn(backend.clone());
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
        let watched = Instant::now();
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
        let client = LockClient::from_dyn(backend.clone());
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
        let sent = Instant::now();
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

    /// Polls a condition with a deadline (an event with no notification to wait on).
    async fn wait_until(mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(Instant::now() < deadline, "not true within 5 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    use std::future::IntoFuture;
}
