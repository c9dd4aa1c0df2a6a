//! A backend wrapper that injects faults per operation: delays, failures, silence, and
//! requests the store applies whose replies are lost.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::backend::async_trait;
use lock_core::backend::{
    lock_unpoisoned, AcquireRequest, Change, DynBackend, Grant, HolderInfo, KeyWatch, LeaseRenewal,
    LockBackend, Ownership, Record, Turn,
};
use lock_core::{Capabilities, Error, ErrorKind, LeaseId, LockKey, Result};

/// An operation of [`LockBackend`] that faults can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `try_acquire`, and a fair queue's `try_acquire_queued`.
    Acquire,
    /// A fair queue's `enqueue` and `leave_queue`.
    Queue,
    /// `renew`, `renew_many` (one call per batch) and `expire_in`.
    Renew,
    /// `release`.
    Release,
    /// `inspect`, `list_held` and `stored_keys`.
    Inspect,
    /// `watch` and `watch_turn`, and the notifications they deliver.
    Watch,
    /// `read_record` and `write_record` (idempotency records).
    Record,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 7] = [
        Op::Acquire,
        Op::Queue,
        Op::Renew,
        Op::Release,
        Op::Inspect,
        Op::Watch,
        Op::Record,
    ];
}

/// What happens to a targeted operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The request reaches the store late.
    Delay(Duration),
    /// The request never reaches the store and fails at once with this kind.
    Fail(ErrorKind),
    /// The request never reaches the store and no reply ever comes.
    BlackHole,
    /// The store applies the request, but the reply is lost: the caller sees
    /// [`ErrorKind::Unavailable`].
    ApplyThenDropReply,
    /// The store applies the request at once; the reply arrives this much later.
    ApplyThenDelayReply(Duration),
    /// For [`Op::Watch`]: the subscription is made but no notification ever arrives.
    DropNotifications,
    /// For [`Op::Acquire`] (`try_acquire`, `try_acquire_queued`): the request is slow on the wire and reaches
    /// the store this much later, whether or not the caller still waits for its reply.
    LandLate(Duration),
}

#[derive(Debug)]
struct Rule {
    fault: Fault,
    /// How many more calls it applies to; `None` for every call.
    remaining: Option<u32>,
}

/// Wraps any backend and injects [`Fault`]s per [`Op`]; also counts calls per operation,
/// so scenarios can prove that nothing reached the store (bad input) or that renewal
/// stopped (no renewals after release).
#[derive(Debug)]
pub struct FaultyBackend {
    inner: DynBackend,
    rules: Mutex<HashMap<Op, Rule>>,
    calls: [AtomicU64; 7],
    completed: [AtomicU64; 7],
    /// Requests of [`Fault::LandLate`] that reached the store, whether or not anyone still
    /// waited for them.
    landed: Arc<AtomicU64>,
    /// The lease ids acquisitions were attempted with (try, queue or queued attempt).
    attempted_by: Mutex<HashSet<LeaseId>>,
}

impl FaultyBackend {
    /// Wraps `inner` with no fault in force.
    pub fn new(inner: DynBackend) -> Arc<Self> {
        Arc::new(FaultyBackend {
            inner,
            rules: Mutex::new(HashMap::new()),
            calls: Default::default(),
            completed: Default::default(),
            landed: Arc::default(),
            attempted_by: Mutex::default(),
        })
    }

    /// Applies `fault` to every later call of `op`.
    pub fn inject(&self, op: Op, fault: Fault) {
        self.rules().insert(
            op,
            Rule {
                fault,
                remaining: None,
            },
        );
    }

    /// Applies `fault` to the next `times` calls of `op` only.
    pub fn inject_times(&self, op: Op, fault: Fault, times: u32) {
        self.rules().insert(
            op,
            Rule {
                fault,
                remaining: Some(times),
            },
        );
    }

    /// Removes every fault: the store is healthy again.
    pub fn heal(&self) {
        self.rules().clear();
    }

    /// How many calls of `op` were made (with or without a fault).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[index(op)].load(Ordering::SeqCst)
    }

    /// How many calls of `op` have returned to the caller.
    pub fn completed(&self, op: Op) -> u64 {
        self.completed[index(op)].load(Ordering::SeqCst)
    }

    /// How many [`Fault::LandLate`] requests have reached the store so far.
    pub fn landed(&self) -> u64 {
        self.landed.load(Ordering::SeqCst)
    }

    /// How many distinct acquisitions (lease ids) have reached the store through this
    /// client: each is one remote waiter or holder.
    pub fn acquisitions_seen(&self) -> usize {
        lock_unpoisoned(&self.attempted_by).len()
    }

    fn attempted(&self, request: &AcquireRequest) {
        lock_unpoisoned(&self.attempted_by).insert(request.lease_id());
    }

    /// Calls of every operation together.
    pub fn total_calls(&self) -> u64 {
        Op::ALL.iter().map(|op| self.calls(*op)).sum()
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, HashMap<Op, Rule>> {
        lock_unpoisoned(&self.rules)
    }

    /// Counts the call and takes the fault in force for it, if any.
    fn fault_for(&self, op: Op) -> Option<Fault> {
        self.calls[index(op)].fetch_add(1, Ordering::SeqCst);
        let mut rules = self.rules();
        let rule = rules.get_mut(&op)?;
        let fault = rule.fault;
        if let Some(remaining) = rule.remaining.as_mut() {
            *remaining -= 1;
            if *remaining == 0 {
                rules.remove(&op);
            }
        }
        Some(fault)
    }

    /// The delay of a [`Fault::LandLate`] in force for the next acquisition, taking it.
    fn lands_late(&self) -> Option<Duration> {
        let late = matches!(
            self.rules().get(&Op::Acquire),
            Some(Rule {
                fault: Fault::LandLate(_),
                ..
            })
        );
        match late.then(|| self.fault_for(Op::Acquire)).flatten() {
            Some(Fault::LandLate(delay)) => Some(delay),
            _ => None,
        }
    }

    /// Runs `request` `delay` late in a task of its own: the store applies it even if this
    /// caller is gone.
    async fn land_late<T: Send + 'static>(
        &self,
        delay: Duration,
        request: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let landed = Arc::clone(&self.landed);
        let landing = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let result = request.await;
            landed.fetch_add(1, Ordering::SeqCst);
            result
        });
        let result = landing
            .await
            .map_err(|e| Error::new(ErrorKind::Internal, format!("late request failed: {e}")))?;
        self.completed[index(Op::Acquire)].fetch_add(1, Ordering::SeqCst);
        result
    }

    async fn faulted<T: Send>(
        &self,
        op: Op,
        call: impl std::future::Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let result = self.apply(op, call).await;
        self.completed[index(op)].fetch_add(1, Ordering::SeqCst);
        result
    }

    async fn apply<T: Send>(
        &self,
        op: Op,
        call: impl std::future::Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        match self.fault_for(op) {
            None | Some(Fault::DropNotifications | Fault::LandLate(_)) => call.await,
            Some(Fault::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                call.await
            }
            Some(Fault::Fail(kind)) => {
                Err(Error::new(kind, format!("injected {kind} fault on {op:?}")))
            }
            Some(Fault::BlackHole) => std::future::pending().await,
            Some(Fault::ApplyThenDropReply) => {
                let _applied = call.await;
                Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("injected fault: {op:?} applied but its reply was lost"),
                ))
            }
            Some(Fault::ApplyThenDelayReply(delay)) => {
                let result = call.await;
                tokio::time::sleep(delay).await;
                result
            }
        }
    }
}

fn index(op: Op) -> usize {
    match op {
        Op::Acquire => 0,
        Op::Renew => 1,
        Op::Release => 2,
        Op::Inspect => 3,
        Op::Watch => 4,
        Op::Queue => 5,
        Op::Record => 6,
    }
}

struct SilentWatch;

#[async_trait]
impl KeyWatch for SilentWatch {
    async fn changed(&mut self) -> Result<Change> {
        std::future::pending().await
    }
}

/// Every operation is forwarded (a wrapper that inherited a default would silently stop
/// testing what the wrapped backend does there).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl LockBackend for FaultyBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<Option<Vec<Grant>>> {
        requests.iter().for_each(|request| self.attempted(request));
        self.faulted(Op::Acquire, self.inner.try_acquire_all(requests))
            .await
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        self.attempted(request);
        let Some(delay) = self.lands_late() else {
            return self
                .faulted(Op::Acquire, self.inner.try_acquire(request))
                .await;
        };
        let (inner, request) = (self.inner.clone(), request.clone());
        self.land_late(delay, async move { inner.try_acquire(&request).await })
            .await
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.faulted(Op::Renew, self.inner.renew(key, lease_id, ttl))
            .await
    }

    async fn expire_in(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl: Duration,
    ) -> Result<Ownership> {
        self.faulted(Op::Renew, self.inner.expire_in(key, lease_id, ttl))
            .await
    }

    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        let renewed = self
            .faulted(Op::Renew, async { Ok(self.inner.renew_many(leases).await) })
            .await;
        renewed.unwrap_or_else(|err| vec![Err(err); leases.len()])
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.faulted(Op::Release, self.inner.release(key, lease_id))
            .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        self.faulted(Op::Inspect, self.inner.inspect(key)).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        self.faulted(Op::Inspect, self.inner.holders(key)).await
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        self.faulted(Op::Inspect, self.inner.list_held(prefix, limit))
            .await
    }

    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.faulted(Op::Inspect, self.inner.stored_keys(prefix))
            .await
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        self.watched(self.inner.watch(key)).await
    }

    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        self.attempted(request);
        self.faulted(Op::Queue, self.inner.enqueue(request)).await
    }

    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        self.attempted(request);
        let Some(delay) = self.lands_late() else {
            return self
                .faulted(Op::Acquire, self.inner.try_acquire_queued(request))
                .await;
        };
        let (inner, request) = (self.inner.clone(), request.clone());
        self.land_late(
            delay,
            async move { inner.try_acquire_queued(&request).await },
        )
        .await
    }

    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        self.faulted(Op::Queue, self.inner.leave_queue(key, lease_id))
            .await
    }

    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        self.watched(self.inner.watch_turn(request)).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        self.faulted(Op::Record, self.inner.read_record(key)).await
    }

    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        self.faulted(
            Op::Record,
            self.inner.write_record(key, lease_id, record, retention),
        )
        .await
    }
}

impl FaultyBackend {
    /// A subscription through the [`Op::Watch`] faults.
    async fn watched(
        &self,
        subscribing: impl std::future::Future<Output = Result<Option<Box<dyn KeyWatch>>>> + Send,
    ) -> Result<Option<Box<dyn KeyWatch>>> {
        let drop_all = matches!(self.rules().get(&Op::Watch), Some(rule) if rule.fault == Fault::DropNotifications);
        let watch = self.faulted(Op::Watch, subscribing).await?;
        Ok(match watch {
            Some(_) if drop_all => Some(Box::new(SilentWatch)),
            other => other,
        })
    }
}
