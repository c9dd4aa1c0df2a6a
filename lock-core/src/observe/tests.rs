//! A recorder installed for this test binary sees every metric, and a guard's health
//! follows its renewals.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

use crate::backend::{
    AcquireRequest, Capabilities, Grant, HolderInfo, LeaseRenewal, LockBackend, Ownership,
};
use crate::values::error::{Error, Result};
use crate::values::key::LockKey;
use crate::values::lease::LeaseId;
use crate::{ErrorKind, LeaseHealth, LockClient, LossReason, MemoryBackend};

/// One metric's value (counter total, gauge level, histogram sum) and how many times it
/// was touched.
#[derive(Debug, Default)]
struct Cell {
    value: Mutex<(f64, u64)>,
}

impl Cell {
    fn add(&self, by: f64) {
        let mut value = self.value.lock().unwrap();
        value.0 += by;
        value.1 += 1;
    }
}

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.add(value as f64);
    }
    fn absolute(&self, value: u64) {
        *self.value.lock().unwrap() = (value as f64, 1);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, value: f64) {
        self.add(value);
    }
    fn decrement(&self, value: f64) {
        self.add(-value);
    }
    fn set(&self, value: f64) {
        *self.value.lock().unwrap() = (value, 1);
    }
}

impl HistogramFn for Cell {
    fn record(&self, value: f64) {
        self.add(value);
    }
}

/// A metric's name and labels (sorted).
type MetricId = (String, Vec<(String, String)>);

/// Every metric by name and labels.
#[derive(Debug, Default)]
struct TestRecorder {
    cells: Mutex<HashMap<MetricId, Arc<Cell>>>,
}

impl TestRecorder {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|label| (label.key().to_owned(), label.value().to_owned()))
            .collect();
        labels.sort();
        let name = key.name().to_owned();
        Arc::clone(
            self.cells
                .lock()
                .unwrap()
                .entry((name, labels))
                .or_default(),
        )
    }

    /// (value, touches) of `name` with exactly `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> (f64, u64) {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.cells
            .lock()
            .unwrap()
            .get(&(name.to_owned(), labels))
            .map_or((0.0, 0), |cell| *cell.value.lock().unwrap())
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

/// The recorder of this test binary (tests tell their metrics apart by backend name).
fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder).expect("the only recorder of the test binary");
        recorder
    })
}

/// The memory store under a name of the test's own, whose renewals can be made to fail
/// as if the store were unreachable.
#[derive(Debug)]
struct Observed {
    name: &'static str,
    store: MemoryBackend,
    failing: AtomicBool,
}

impl Observed {
    fn new(name: &'static str, store: &MemoryBackend) -> Arc<Self> {
        Arc::new(Observed {
            name,
            store: store.clone(),
            failing: AtomicBool::new(false),
        })
    }

    fn reachable(&self) -> Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::unavailable("the test made the store unreachable"));
        }
        Ok(())
    }
}

#[async_trait]
impl LockBackend for Observed {
    fn name(&self) -> &'static str {
        self.name
    }
    fn capabilities(&self) -> &Capabilities {
        self.store.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        self.store.try_acquire(request).await
    }
    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        self.reachable()?;
        self.store.renew(key, lease_id, ttl).await
    }
    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        match self.reachable() {
            Ok(()) => self.store.renew_many(leases).await,
            Err(err) => vec![Err(err); leases.len()],
        }
    }
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.store.release(key, lease_id).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        self.store.inspect(key).await
    }
}

/// Waits for a condition with a deadline (a metric has no notification to wait on).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = crate::values::clock::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            crate::values::clock::now() < deadline,
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Acquisitions by outcome, wait time, hold time, renewal latency and failures, losses by
/// reason and waiters all reach the program's recorder, labelled with the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_sees_every_metric() {
    use super::*;
    let recorder = recorder();
    const NAME: &str = "observed-metrics";
    let backend = &[("backend", NAME)];
    let store = MemoryBackend::new();
    let (link, rival_link) = (Observed::new(NAME, &store), Observed::new(NAME, &store));
    let (client, rival) = (LockClient::new(link.clone()), LockClient::new(rival_link));
    let ttl = Duration::from_millis(600);
    let guard = client.lock("k").ttl(ttl).await.unwrap();
    let refused = rival.try_lock("k").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::HeldByAnother);
    let waiting = tokio::spawn(
        rival
            .lock("k")
            .ttl(ttl)
            .wait_up_to(Duration::from_secs(20))
            .into_future(),
    );
    eventually("a waiter counted", || {
        recorder.get(WAITERS, backend).0 == 1.0
    })
    .await;
    eventually("a renewal timed", || {
        recorder.get(RENEWAL_LATENCY, backend).1 > 0
    })
    .await;
    link.failing.store(true, Ordering::SeqCst);
    let reason = tokio::time::timeout(ttl * 3, guard.lost())
        .await
        .expect("lost");
    assert_eq!(reason, LossReason::DeadlinePassed);
    let rival_guard = waiting.await.unwrap().unwrap();
    rival_guard.release().await.unwrap();
    eventually("the waiter no longer counted", || {
        recorder.get(WAITERS, backend).0 == 0.0
    })
    .await;

    let outcome = |outcome| [("backend", NAME), ("outcome", outcome)];
    assert_eq!(recorder.get(ACQUISITIONS, &outcome("ok")).0, 2.0);
    assert_eq!(
        recorder.get(ACQUISITIONS, &outcome("held_by_another")).0,
        1.0
    );
    assert_eq!(recorder.get(ACQUIRE_WAIT, &outcome("ok")).1, 2);
    assert!(recorder.get(RENEWAL_FAILURES, &outcome("unavailable")).0 >= 1.0);
    let reason = [("backend", NAME), ("reason", "deadline_passed")];
    assert_eq!(recorder.get(LOSSES, &reason).0, 1.0);
    let (lost_for, losses) = recorder.get(HOLD, &[("backend", NAME), ("end", "lost")]);
    assert_eq!(losses, 1);
    assert!(lost_for >= (ttl / 2).as_secs_f64(), "held {lost_for} s");
    assert_eq!(
        recorder
            .get(HOLD, &[("backend", NAME), ("end", "released")])
            .1,
        1
    );
}

/// Failing renewals turn the guard `Suspended` while the lease is still held; answered
/// ones make it `Healthy` again; the loss is final and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_warns_of_failing_renewals_before_the_loss() {
    let store = MemoryBackend::new();
    let link = Observed::new("observed-health", &store);
    let client = LockClient::new(link.clone());
    let ttl = Duration::from_millis(900);
    let guard = client.lock("k").ttl(ttl).await.unwrap();
    assert_eq!(guard.health(), LeaseHealth::Healthy);
    link.failing.store(true, Ordering::SeqCst);
    let warned = tokio::time::timeout(ttl, guard.renewal_trouble())
        .await
        .expect("no warning within the TTL");
    assert_eq!(warned, LeaseHealth::Suspended);
    assert!(guard.is_held(), "the warning came only with the loss");
    assert_eq!(guard.loss_reason(), None);
    link.failing.store(false, Ordering::SeqCst);
    let recovered = tokio::time::timeout(ttl, guard.health_changed(LeaseHealth::Suspended))
        .await
        .expect("not healthy again after renewals came back");
    assert_eq!(recovered, LeaseHealth::Healthy);
    link.failing.store(true, Ordering::SeqCst);
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("lost");
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert_eq!(
        guard.health(),
        LeaseHealth::Lost(LossReason::DeadlinePassed)
    );
    assert_eq!(guard.loss_reason(), Some(LossReason::DeadlinePassed));
    assert_eq!(guard.release().await.unwrap_err().kind(), ErrorKind::Lost);
}

use std::future::IntoFuture;
