//! What a backend provides to be tested, and what every scenario gets to work with.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::{lock_unpoisoned, DynBackend};
use lock_core::{AcquireOptions, Capabilities, HoldKind, LockClient, LockKey};

pub use crate::factory::BackendFactory;
use crate::factory::{PrivateServers, ServerFactory};
pub use crate::failure::{Failure, Outcome};
use crate::faults::FaultyBackend;
pub use crate::proxy::LinkControl;

/// Everything a caller could print about an error: its message, its `Debug` form and
/// every source in its chain (with theirs), for tests that a secret never shows.
pub fn everything_shown(err: &lock_core::Error) -> String {
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    text
}

/// Fails the scenario with a formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}

/// Unwraps an expected error of a given kind, or fails the scenario.
pub fn expect_kind<T: fmt::Debug>(
    result: lock_core::Result<T>,
    kind: lock_core::ErrorKind,
    what: &str,
) -> Result<lock_core::Error, Failure> {
    match result {
        Err(err) if err.kind() == kind => Ok(err),
        Err(err) => Err(Failure(format!(
            "{what}: expected a {kind:?} error, got {err} ({err:?})"
        ))),
        Ok(value) => Err(Failure(format!(
            "{what}: expected a {kind:?} error, got Ok({value:?})"
        ))),
    }
}

/// Expects a release to report the lease held until then; fails the scenario (saying
/// `what`) when it was lost or the release failed.
pub fn released(result: lock_core::Result<()>, what: &str) -> Outcome {
    result.map_err(|err| Failure(format!("{what}: {err} ({err:?})")))
}

/// Timer and scheduler lateness tolerated on top of every time bound. Generous for a
/// loaded two-core machine, yet far below the intervals the scenarios measure.
pub const SLACK: Duration = Duration::from_millis(300);

/// One scenario's view of the backend under test: a private key prefix, fresh clients, and
/// the keys it used (released again after the scenario, whatever its outcome).
pub struct Ctx {
    factory: Arc<dyn BackendFactory>,
    capabilities: Capabilities,
    prefix: String,
    keys: Mutex<Vec<LockKey>>,
}

impl Ctx {
    /// A context with a random key prefix.
    pub fn new(factory: Arc<dyn BackendFactory>, capabilities: Capabilities) -> Self {
        Ctx {
            factory,
            capabilities,
            prefix: format!("dlct-{:016x}/", fastrand::u64(..)),
            keys: Mutex::new(Vec::new()),
        }
    }

    /// The backend's declared capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// The factory under test.
    pub fn factory(&self) -> &Arc<dyn BackendFactory> {
        &self.factory
    }

    /// This run's key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A key under this run's prefix, remembered for cleanup.
    pub fn key(&self, name: &str) -> String {
        let key = format!("{}{name}", self.prefix);
        if let Ok(parsed) = LockKey::new(&key) {
            lock_unpoisoned(&self.keys).push(parsed);
        }
        key
    }

    /// A new independent backend client.
    pub async fn backend(&self) -> Result<DynBackend, Failure> {
        Ok(self.factory.connect().await?)
    }

    /// A new independent client with the suite's default options.
    pub async fn client(&self) -> Result<LockClient, Failure> {
        Ok(LockClient::new(self.backend().await?).with_defaults(self.options()))
    }

    /// A new client with the suite's default options whose link the scenario controls.
    pub async fn linked_client(&self) -> Result<(LockClient, Arc<dyn LinkControl>), Failure> {
        let (backend, link) = self
            .factory
            .connect_with_link()
            .await
            .ok_or_else(|| Failure("the factory cannot cut a client's link".into()))??;
        Ok((LockClient::new(backend).with_defaults(self.options()), link))
    }

    /// The factory's servers, or a failure for an embedded store.
    pub fn servers(&self) -> Result<&ServerFactory, Failure> {
        self.factory
            .servers()
            .ok_or_else(|| Failure("the store runs no servers".into()))
    }

    /// Servers of the store under test for this scenario alone.
    pub async fn private_servers(&self) -> Result<PrivateServers, Failure> {
        self.servers()?.start_private().await
    }

    /// A new client wrapped in a fault injector (returned too, to steer it).
    pub async fn faulty_client(&self) -> Result<(LockClient, Arc<FaultyBackend>), Failure> {
        let faulty = FaultyBackend::new(self.backend().await?);
        let client = LockClient::new(faulty.clone()).with_defaults(self.options());
        Ok((client, faulty))
    }

    /// Default options: a long TTL (scenarios that need expiry ask for [`short_ttl`]).
    ///
    /// [`short_ttl`]: Self::short_ttl
    pub fn options(&self) -> AcquireOptions {
        AcquireOptions {
            ttl: self.long_ttl(),
            ..AcquireOptions::default()
        }
    }

    /// The shortest TTL the scenarios rely on: long enough for a round trip and timer
    /// lateness, short enough to wait out many times.
    pub fn short_ttl(&self) -> Duration {
        self.factory
            .shortest_ttl()
            .max(self.capabilities.min_ttl)
            .max(self.capabilities.ttl_granularity * 2)
    }

    /// A TTL no scenario waits out.
    pub fn long_ttl(&self) -> Duration {
        Duration::from_secs(60).min(self.capabilities.max_ttl)
    }

    /// Releases whatever live lease the scenario's keys still have.
    pub async fn cleanup(&self) {
        let keys = std::mem::take(&mut *lock_unpoisoned(&self.keys));
        let Ok(backend) = self.factory.connect().await else {
            return;
        };
        let shared = [HoldKind::Permit { limit: 1 }, HoldKind::Read];
        for key in keys {
            if let Ok(Some(info)) = backend.inspect(&key).await {
                let _ = backend.release(&key, info.lease_id).await;
            }
            if !self.capabilities.shared_holds {
                continue;
            }
            for kind in shared {
                let Ok(key) = key.held_as(kind) else { continue };
                for holder in backend.holders(&key).await.unwrap_or_default() {
                    let _ = backend.release(&key, holder.lease_id).await;
                }
            }
        }
    }
}

/// Polls `check` until it returns `true` or `within` passes: waiting on an observable
/// event with a deadline, never a bare sleep.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F) -> Outcome
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Failure>>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Failure(format!("{what}: not true within {within:?}")));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs `future`, failing the scenario if it takes longer than `within`.
pub async fn within<T>(
    within: Duration,
    what: &str,
    future: impl std::future::IntoFuture<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout(within, future)
        .await
        .map_err(|_| Failure(format!("{what}: did not finish within {within:?}")))
}

/// Waits for every task of `tasks`, failing on the first failure, a panic, or when they
/// take longer than `limit` together.
pub async fn join_all(
    limit: Duration,
    what: &str,
    tasks: &mut tokio::task::JoinSet<Outcome>,
) -> Outcome {
    within(limit, what, async {
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| Failure(format!("{what}: task panicked: {e}")))??;
        }
        Ok(())
    })
    .await?
}

/// Starts `client` locking `key` with `options` in a task that also notes when the lock
/// was granted.
pub fn spawn_lock(
    client: lock_core::LockClient,
    key: &str,
    options: AcquireOptions,
) -> tokio::task::JoinHandle<lock_core::Result<(lock_core::LockGuard, Instant)>> {
    let key = key.to_string();
    tokio::spawn(async move {
        let guard = client.lock(&key).options(options).await?;
        Ok((guard, Instant::now()))
    })
}

/// Awaits a task from [`spawn_lock`] for at most `limit`.
pub async fn granted_within(
    limit: Duration,
    what: &str,
    task: tokio::task::JoinHandle<lock_core::Result<(lock_core::LockGuard, Instant)>>,
) -> Result<(lock_core::LockGuard, Instant), Failure> {
    Ok(within(limit, what, task)
        .await?
        .map_err(|e| Failure(format!("{what}: task failed: {e}")))??)
}

/// Expects `attempt` to fail with a retryable [`ErrorKind::Unavailable`] no later than
/// `bound` plus [`SLACK`].
///
/// [`ErrorKind::Unavailable`]: lock_core::ErrorKind::Unavailable
pub async fn unavailable_within<T: fmt::Debug>(
    bound: Duration,
    what: &str,
    attempt: impl std::future::IntoFuture<Output = lock_core::Result<T>>,
) -> Outcome {
    let started = Instant::now();
    let err = expect_kind(attempt.await, lock_core::ErrorKind::Unavailable, what)?;
    ensure!(err.is_retryable(), "{what}: unavailable must be retryable");
    ensure!(
        started.elapsed() <= bound + SLACK,
        "{what}: gave up after {:?}, bound {bound:?}",
        started.elapsed()
    );
    Ok(())
}
