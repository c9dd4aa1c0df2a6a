//! Locks for synchronous programs: the client, requests and guards of the async API, with
//! methods that block the calling thread until the store answers (as `reqwest::blocking`
//! does for HTTP).
//!
//! ```
//! use std::time::Duration;
//!
//! fn main() -> distlock::Result<()> {
//!     // Any store URL; `sqlite:///var/lib/myapp/locks.db` coordinates the processes of
//!     // one machine through a file.
//!     let client = distlock::blocking::connect("memory://blocking-example")?;
//!     let guard = client
//!         .lock("invoices/2026-11")
//!         .ttl(Duration::from_secs(10))
//!         .wait_up_to(Duration::from_secs(30))
//!         .acquire()?;
//!     // The lease is renewed in the background while this thread works.
//!     println!("holding {} with fencing token {}", guard.key(), guard.token());
//!     assert!(guard.is_held());
//!     // `Err(Lost)` if the lease was lost before the release: what ran after that moment
//!     // was not protected. Dropping the guard releases too, without the answer.
//!     guard.release()?;
//!     Ok(())
//! }
//! ```
//!
//! Each client runs the store's I/O and the renewal of its leases on a Tokio runtime of
//! its own, with one thread; clones share it, so connect once and clone. The calling
//! thread only waits, so the methods work from any thread, including one inside an async
//! runtime (where they block that runtime's worker while they wait: async code should use
//! the async API instead).
//!
//! The patterns of the async client are here too, with the same names: [`LockClient::once`],
//! [`LockClient::idempotent`] and [`LockClient::with_lock`] (or [`LockRequest::scoped`]).
//! Their work is a plain closure run on the calling thread (it need not be `Send`) while
//! the runtime keeps the lock; as a thread cannot be stopped from outside, a lock lost
//! while the work runs is reported when it returns, as [`ErrorKind::Lost`].

#![cfg(feature = "blocking")]
#![cfg_attr(docsrs, doc(cfg(feature = "blocking")))]

use std::future::{Future, IntoFuture};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use lock_core::{
    Capabilities, Execution, FencingToken, Lease, LeaseHealth, LockKey, LockScope, LockStatus,
    LossReason, Renewal, Wait,
};
use tokio::sync::oneshot;
use tokio::task::JoinError;

use crate::{Error, ErrorKind, Result};

/// A client for the store named by `url`, as [`crate::connect`] gives, over a runtime of
/// its own. Fails as `connect` does, or with [`ErrorKind::Internal`] if the runtime's
/// thread cannot be started.
pub fn connect(url: &str) -> Result<LockClient> {
    let runtime = Arc::new(Runtime::start()?);
    let url = url.to_owned();
    let client = runtime.wait(async move { crate::connect(&url).await })?;
    Ok(LockClient { client, runtime })
}

/// Locks keys on one store, blocking. Cheap to clone; clones share the store connection,
/// the renewal of every lease and the runtime thread.
#[derive(Clone, Debug)]
pub struct LockClient {
    client: crate::LockClient,
    runtime: Arc<Runtime>,
}

impl LockClient {
    /// A request for `key` with the default options (as
    /// [`AcquireOptions::default`](crate::AcquireOptions): waiting for as long as the key
    /// is held), to refine and [`acquire`](LockRequest::acquire).
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest {
        LockRequest {
            request: self.client.lock(key),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// A request for `key` that does not wait: a held key is
    /// [`ErrorKind::HeldByAnother`].
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.lock(key).no_wait()
    }

    /// Who holds `key` right now (token, remaining TTL, waiters, label where the store
    /// keeps them); never the holder's lease id.
    pub fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockStatus>> {
        let client = self.client.clone();
        let key = key.as_ref().to_owned();
        self.runtime.wait(async move { client.inspect(key).await })
    }

    /// What the store promises and where its limits are; see
    /// [`LockClient::capabilities`](crate::LockClient::capabilities).
    pub fn capabilities(&self) -> &Capabilities {
        self.client.capabilities()
    }

    /// A once-per-window ticket for `key`: the job runs on whichever replica gets it, and
    /// nobody runs it again within the window. See [`OnceRequest`].
    pub fn once(&self, key: impl AsRef<str>) -> OnceRequest {
        OnceRequest {
            request: self.client.once(key),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// An idempotent run of a piece of work for `key`: at most one result is recorded,
    /// however often it is retried, and retries get the recorded result. See
    /// [`IdempotentRequest`].
    pub fn idempotent(&self, key: impl AsRef<str>) -> IdempotentRequest {
        IdempotentRequest {
            request: self.client.idempotent(key),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// Runs `body` on this thread under the lock on `key` (with the client's default
    /// options), then releases it: [`LockRequest::scoped`] on [`lock`](Self::lock)`(key)`,
    /// which says how a loss is reported (the body is not stopped, the call fails).
    pub fn with_lock<T>(
        &self,
        key: impl AsRef<str>,
        body: impl FnOnce(LockScope) -> T,
    ) -> Result<T> {
        self.lock(key).scoped(body)
    }

    /// Gives back every lease this client and its clones hold, and refuses further
    /// acquisitions; see [`LockClient::shutdown`](crate::LockClient::shutdown) (an
    /// unfinished [`OnceTicket`] is left to its window).
    pub fn shutdown(&self) -> Result<()> {
        let client = self.client.clone();
        self.runtime.wait(async move { client.shutdown().await })
    }
}

/// A blocking lock request: refine it, then [`acquire`](Self::acquire) it for a guard.
#[must_use = "a lock request does nothing until acquired"]
#[derive(Debug)]
pub struct LockRequest {
    request: crate::LockRequest,
    runtime: Arc<Runtime>,
}

impl LockRequest {
    /// How long the store keeps the lease without renewal; the client's runtime renews it
    /// while the guard lives.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.request = self.request.ttl(ttl);
        self
    }

    /// How long to wait for a held key.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.request = self.request.wait(wait);
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

    /// Who keeps the lease alive: with [`Renewal::Manual`] the holder calls
    /// [`LockGuard::renew`] itself before the TTL runs out.
    pub fn renewal(mut self, renewal: Renewal) -> Self {
        self.request = self.request.renewal(renewal);
        self
    }

    /// Labels the holder for [`LockClient::inspect`].
    pub fn holder_label(mut self, label: impl AsRef<str>) -> Self {
        self.request = self.request.holder_label(label);
        self
    }

    /// Blocks until the lock is granted, or fails as the async request does
    /// ([`ErrorKind::HeldByAnother`], [`ErrorKind::TimedOut`], ...).
    pub fn acquire(self) -> Result<LockGuard> {
        let guard = self.runtime.wait(self.request.into_future())?;
        Ok(LockGuard {
            key: guard.key().clone(),
            token: guard.token(),
            guard: Some(guard),
            runtime: self.runtime,
        })
    }

    /// Acquires the lock, runs `body` on this thread while it is held, then releases it;
    /// the blocking form of [`LockRequest::scoped`](crate::LockRequest::scoped).
    ///
    /// A thread cannot be stopped from outside, so where the async form drops its body the
    /// moment the lock is lost, this one lets `body` run to its end and then fails with
    /// [`ErrorKind::Lost`], dropping the body's value: what it did after the loss was not
    /// protected, and the caller must treat its outcome as unknown. A body that should
    /// stop early checks [`LockScope::is_held`] between its steps. A loss the release
    /// finds (the store dropped the lease behind the holder's back) is reported the same
    /// way. The key is given back at the loss already, not when the body returns.
    /// Acquisition errors are returned as they come; the body's own errors are part of its
    /// value `T`.
    ///
    /// ```
    /// # fn main() -> distlock::Result<()> {
    /// let client = distlock::blocking::connect("memory://blocking-scoped")?;
    /// let written = client
    ///     .lock("ledger")
    ///     .scoped(|scope| format!("written under token {}", scope.token()))?;
    /// assert!(written.starts_with("written under token"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn scoped<T>(self, body: impl FnOnce(LockScope) -> T) -> Result<T> {
        let request = self.request;
        let (outcome, value) = self.runtime.serve(
            move |caller: CallerThread<_, ()>| {
                request.scoped(move |scope| async move { caller.run(scope).await })
            },
            |scope| ((), body(scope)),
        );
        outcome?;
        value.ok_or_else(stopped)
    }
}

/// Proof of holding a lock, blocking.
///
/// [`release`](Self::release) gives the lock back and says whether the lease was held
/// until then. Dropping the guard releases too, and also waits for the store (bounded by
/// the request time-out), so the key is free when the drop returns; a failure there is
/// only logged, and the lease then ends by its TTL.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct LockGuard {
    key: LockKey,
    token: FencingToken,
    /// Taken only by `release` and by the drop, which end the guard.
    guard: Option<crate::LockGuard>,
    runtime: Arc<Runtime>,
}

impl LockGuard {
    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token of this ownership: pass it to every resource the lock protects.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Whether the lease is held and its local deadline is ahead. Cheap: no store call.
    pub fn is_held(&self) -> bool {
        self.guard.as_ref().is_some_and(crate::LockGuard::is_held)
    }

    /// Why the lease was lost, once it was; `None` while it is held.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.guard.as_ref().and_then(crate::LockGuard::loss_reason)
    }

    /// The current lease (its deadline moves with each renewal).
    pub fn lease(&self) -> Option<Lease> {
        self.guard.as_ref().map(crate::LockGuard::lease)
    }

    /// How the lease is doing: [`LeaseHealth::Suspended`] as soon as a renewal fails,
    /// before the lease is lost; see [`LockGuard::health`](crate::LockGuard::health).
    pub fn health(&self) -> LeaseHealth {
        self.guard
            .as_ref()
            .map_or(LeaseHealth::Healthy, crate::LockGuard::health)
    }

    /// Waits up to `bound` for the lease to be lost: the reason if it was (at once if it
    /// already is), `None` if it is still held when `bound` ends. The blocking form of
    /// [`LockGuard::lost`](crate::LockGuard::lost), whose docs say when a loss fires.
    pub fn lost_within(&self, bound: Duration) -> Option<LossReason> {
        let lost = self.guard.as_ref()?.lost();
        self.runtime
            .wait(async move { Ok(tokio::time::timeout(bound, lost).await.ok()) })
            .ok()
            .flatten()
    }

    /// Renews the lease now, for [`Renewal::Manual`] (allowed with automatic renewal
    /// too): [`ErrorKind::Lost`] when it is no longer held, as
    /// [`LockGuard::renew`](crate::LockGuard::renew).
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::Renewal;
    ///
    /// # fn main() -> distlock::Result<()> {
    /// let client = distlock::blocking::connect("memory://blocking-renew")?;
    /// let guard = client
    ///     .lock("batch")
    ///     .ttl(Duration::from_secs(10))
    ///     .renewal(Renewal::Manual)
    ///     .acquire()?;
    /// for step in 0..3 {
    ///     // ... one step of the work, shorter than the TTL ...
    ///     guard.renew()?; // the lease runs for another TTL from here
    /// #   let _ = step;
    /// }
    /// guard.release()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn renew(&self) -> Result<()> {
        let Some(guard) = self.guard.as_ref() else {
            return Err(Error::new(ErrorKind::Lost, "the guard was released"));
        };
        self.runtime.wait_borrowing(guard.renew())
    }

    /// Gives the lock back: `Ok(())` when the lease was held until now,
    /// [`ErrorKind::Lost`] when it had been lost (what ran after that was not protected).
    pub fn release(mut self) -> Result<()> {
        match self.guard.take() {
            Some(guard) => self.runtime.wait(guard.release()),
            None => Ok(()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let key = self.key.clone();
            if let Err(err) = self.runtime.wait(guard.release()) {
                tracing::debug!(%key, error = %err, "release of a dropped blocking guard: {err}");
            }
        }
    }
}

/// A blocking once-per-window request: refine it, then [`acquire`](Self::acquire) it;
/// see [`crate::OnceRequest`] for what the window means.
///
/// ```
/// use std::time::Duration;
///
/// # fn main() -> distlock::Result<()> {
/// let replica_a = distlock::blocking::connect("memory://blocking-once")?;
/// let replica_b = distlock::blocking::connect("memory://blocking-once")?;
/// let window = |client: &distlock::blocking::LockClient| {
///     client
///         .once("reports/nightly")
///         .at_least(Duration::from_secs(60))
///         .at_most(Duration::from_secs(600))
/// };
/// let ticket = window(&replica_a).acquire()?.expect("first in the window");
/// // ... run the job ...
/// ticket.finish()?;
/// // Finished early: the key stays taken until a minute after the start.
/// assert!(window(&replica_b).acquire()?.is_none());
/// # Ok(())
/// # }
/// ```
#[must_use = "a once request does nothing until acquired"]
#[derive(Debug)]
pub struct OnceRequest {
    request: crate::OnceRequest,
    runtime: Arc<Runtime>,
}

impl OnceRequest {
    /// The key stays taken at least this long from the start. Default: zero.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.request = self.request.at_least(at_least);
        self
    }

    /// The key frees itself at most this long after the start if the ticket is never
    /// finished (a crashed or hung job). Default: the client's TTL.
    pub fn at_most(mut self, at_most: Duration) -> Self {
        self.request = self.request.at_most(at_most);
        self
    }

    /// The ticket, or `Ok(None)` at once when the key ran, or is running, within the
    /// window. Never waits. [`ErrorKind::Unsupported`] on a session-bound store, as for
    /// the async request.
    pub fn acquire(self) -> Result<Option<OnceTicket>> {
        let ticket = self.runtime.wait(self.request.into_future())?;
        Ok(ticket.map(|ticket| OnceTicket {
            ticket,
            runtime: self.runtime,
        }))
    }
}

/// The right to run a once-per-window job, blocking; see [`crate::OnceTicket`].
///
/// [`finish`](Self::finish) it when the job is done. Dropping it without finishing (or a
/// [`LockClient::shutdown`] while the job runs) leaves the hold to expire at `at_most`
/// after the start, so nobody runs the job again before then.
#[must_use = "finish the ticket when the job is done"]
#[derive(Debug)]
pub struct OnceTicket {
    ticket: crate::OnceTicket,
    runtime: Arc<Runtime>,
}

impl OnceTicket {
    /// The key.
    pub fn key(&self) -> &LockKey {
        self.ticket.key()
    }

    /// The fencing token of this run: pass it to every resource the job writes.
    pub fn token(&self) -> FencingToken {
        self.ticket.token()
    }

    /// Whether the hold is still ahead of its local deadline (`at_most`, less the drift
    /// allowance). A job still running after that is no longer protected.
    pub fn is_held(&self) -> bool {
        self.ticket.is_held()
    }

    /// The job is done: frees the key at `start + at_least`, at once if that has passed.
    /// [`ErrorKind::Lost`] when the hold had already run out (the job ran past
    /// `at_most`, so another replica may have started it).
    pub fn finish(self) -> Result<()> {
        self.runtime.wait(self.ticket.finish())
    }
}

/// A blocking idempotent run of a piece of work for one key: refine it, then
/// [`run`](Self::run) the work on this thread. See [`crate::IdempotentRequest`] for the
/// steps and guarantees; they are the same.
///
/// ```
/// use distlock::Execution;
///
/// # fn main() -> distlock::Result<()> {
/// let client = distlock::blocking::connect("memory://blocking-idempotent")?;
/// let charge = |_scope| Ok::<_, String>(b"charged 10 EUR".to_vec());
///
/// let first = client.idempotent("payment/4711").fingerprint(b"10 EUR").run(charge)?;
/// assert_eq!(first, Execution::Ran(b"charged 10 EUR".to_vec()));
/// // A retry replays the result without charging again.
/// let retry = client.idempotent("payment/4711").fingerprint(b"10 EUR").run(charge)?;
/// assert_eq!(retry, Execution::Replayed(b"charged 10 EUR".to_vec()));
/// # Ok(())
/// # }
/// ```
#[must_use = "an idempotent request does nothing until run"]
#[derive(Debug)]
pub struct IdempotentRequest {
    request: crate::IdempotentRequest,
    runtime: Arc<Runtime>,
}

impl IdempotentRequest {
    /// Identifies the request the work answers: a retry with a different fingerprint is
    /// refused with [`ErrorKind::InvalidInput`] instead of being replayed another
    /// request's result.
    pub fn fingerprint(mut self, fingerprint: impl AsRef<[u8]>) -> Self {
        self.request = self.request.fingerprint(fingerprint);
        self
    }

    /// How long the store keeps the result for retries. Default: one day.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.request = self.request.retention(retention);
        self
    }

    /// Waits up to `bound` for another caller's run to finish instead of answering
    /// [`Execution::InProgress`] at once.
    pub fn wait_up_to(mut self, bound: Duration) -> Self {
        self.request = self.request.wait_up_to(bound);
        self
    }

    /// The TTL of the lock the work runs under (renewed by the client's runtime while the
    /// work runs on this thread).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.request = self.request.ttl(ttl);
        self
    }

    /// Runs `work` on this thread unless its result is already recorded; the blocking form
    /// of [`IdempotentRequest::run`](crate::IdempotentRequest::run).
    ///
    /// The work is not stopped when the lock is lost (check [`LockScope::is_held`] between
    /// steps to stop early); its result is then refused when recorded, and the call fails
    /// with [`ErrorKind::Lost`]. The work's own error comes back as
    /// [`Execution::Failed`], and nothing is recorded.
    pub fn run<E>(
        self,
        work: impl FnOnce(LockScope) -> std::result::Result<Vec<u8>, E>,
    ) -> Result<Execution<E>> {
        let request = self.request;
        let (outcome, failure) = self.runtime.serve(
            move |caller: CallerThread<_, Option<Vec<u8>>>| {
                request.run(move |scope| async move { caller.run(scope).await.flatten().ok_or(()) })
            },
            |scope| match work(scope) {
                Ok(value) => (Some(value), None),
                Err(err) => (None, Some(err)),
            },
        );
        with_failure(outcome?, failure.flatten())
    }

    /// [`run`](Self::run) for work whose result is any value serde can encode, recorded
    /// as JSON and decoded for every caller, this one included: the blocking form of
    /// [`IdempotentRequest::run_json`](crate::IdempotentRequest::run_json), which says how
    /// results that do not encode or decode are refused. Needs the `serde` cargo feature.
    ///
    /// ```
    /// use distlock::Execution;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Debug, PartialEq, Serialize, Deserialize)]
    /// struct Receipt {
    ///     charged_cents: u64,
    /// }
    ///
    /// # fn main() -> distlock::Result<()> {
    /// let client = distlock::blocking::connect("memory://blocking-run-json")?;
    /// let charge = |_scope| Ok::<_, String>(Receipt { charged_cents: 1000 });
    /// let first = client.idempotent("payment/4711").run_json(charge)?;
    /// let retry = client.idempotent("payment/4711").run_json(charge)?;
    /// assert_eq!(first, Execution::Ran(Receipt { charged_cents: 1000 }));
    /// assert_eq!(retry, Execution::Replayed(Receipt { charged_cents: 1000 }));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "serde")]
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn run_json<T, E>(
        self,
        work: impl FnOnce(LockScope) -> std::result::Result<T, E>,
    ) -> Result<Execution<E, T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    {
        let request = self.request;
        let (outcome, failure) = self.runtime.serve(
            move |caller: CallerThread<_, Option<T>>| {
                request.run_json(
                    move |scope| async move { caller.run(scope).await.flatten().ok_or(()) },
                )
            },
            |scope| match work(scope) {
                Ok(value) => (Some(value), None),
                Err(err) => (None, Some(err)),
            },
        );
        with_failure(outcome?, failure.flatten())
    }
}

/// `execution` with the error the work returned on the calling thread in place of the
/// runtime's marker of a failed run.
fn with_failure<E, T>(execution: Execution<(), T>, failure: Option<E>) -> Result<Execution<E, T>> {
    Ok(match execution {
        Execution::Ran(value) => Execution::Ran(value),
        Execution::Replayed(value) => Execution::Replayed(value),
        Execution::InProgress => Execution::InProgress,
        // The marker comes only from work that returned its error here.
        Execution::Failed(()) => Execution::Failed(failure.ok_or_else(stopped)?),
    })
}

/// What the runtime asks of the thread that waits for it.
enum Step<O, R> {
    /// Run the caller's work under this scope, and reply.
    Work(LockScope, oneshot::Sender<R>),
    /// The runtime's part is over, with this outcome.
    Done(std::result::Result<Result<O>, JoinError>),
}

/// How a task on the runtime has the waiting thread run the caller's synchronous work
/// (which need not be `Send`: it never leaves that thread) and waits for its reply `R`.
struct CallerThread<O, R> {
    steps: mpsc::Sender<Step<O, R>>,
}

impl<O, R> CallerThread<O, R> {
    /// Hands `scope` to the waiting thread and resolves with the work's reply; `None` if
    /// that thread stopped waiting (the work panicked there).
    async fn run(&self, scope: LockScope) -> Option<R> {
        let (reply, replied) = oneshot::channel();
        self.steps.send(Step::Work(scope, reply)).ok()?;
        replied.await.ok()
    }
}

/// A task's outcome; its panic resumed on the waiting thread.
fn finished<T>(joined: std::result::Result<Result<T>, JoinError>) -> Result<T> {
    match joined {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // Tasks are cancelled only by the runtime's shutdown, which waits for the last
        // handle, and the waiting client or guard is one.
        Err(_) => Err(stopped()),
    }
}

/// The error of a blocking call whose runtime stopped before it answered.
fn stopped() -> Error {
    Error::new(
        ErrorKind::Internal,
        "the blocking client's runtime stopped during a request",
    )
}

/// The runtime a blocking client and its guards run on.
#[derive(Debug)]
struct Runtime {
    handle: tokio::runtime::Handle,
    /// Taken by the drop, to shut the runtime down in the way the dropping thread allows.
    owned: Option<tokio::runtime::Runtime>,
}

impl Runtime {
    fn start() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|err| {
                Error::new(
                    ErrorKind::Internal,
                    "could not start the blocking client's runtime thread",
                )
                .with_source(err)
            })?;
        Ok(Runtime {
            handle: runtime.handle().clone(),
            owned: Some(runtime),
        })
    }

    /// Runs `future` on the runtime and blocks this thread until it is done. The future
    /// runs as a task, never on this thread, so this works whatever the thread is doing
    /// (`Handle::block_on` panics inside another runtime); a panic in it is resumed here.
    fn wait<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let task = self.handle.spawn(future);
        let (done, outcome) = mpsc::sync_channel(1);
        self.handle.spawn(async move {
            // The receiver waits for this; it is gone only if that thread panicked.
            let _ = done.send(task.await);
        });
        outcome.recv().map_or_else(|_| Err(stopped()), finished)
    }

    /// [`wait`](Self::wait) for a future that borrows from the caller, so cannot be a
    /// task: it runs on a helper thread of this call's own, outside any runtime (where
    /// `Handle::block_on` works), which the borrow outlives.
    fn wait_borrowing<T: Send>(&self, future: impl Future<Output = Result<T>> + Send) -> Result<T> {
        let handle = &self.handle;
        std::thread::scope(
            |scope| match scope.spawn(move || handle.block_on(future)).join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            },
        )
    }

    /// [`wait`](Self::wait) for a task that has this thread run synchronous work: `task`
    /// gets a [`CallerThread`] to hand `work` its scope; `work` runs here, its reply `R`
    /// goes back to the task, and its local part `L` (which never leaves this thread) is
    /// returned beside the task's outcome, `None` if the task never asked for the work.
    fn serve<O, R, L, F>(
        &self,
        task: impl FnOnce(CallerThread<O, R>) -> F,
        work: impl FnOnce(LockScope) -> (R, L),
    ) -> (Result<O>, Option<L>)
    where
        F: Future<Output = Result<O>> + Send + 'static,
        O: Send + 'static,
        R: Send + 'static,
    {
        let (steps, next) = mpsc::channel();
        let task = self.handle.spawn(task(CallerThread {
            steps: steps.clone(),
        }));
        self.handle.spawn(async move {
            // The receiver is gone only if the work panicked on the waiting thread.
            let _ = steps.send(Step::Done(task.await));
        });
        let mut work = Some(work);
        let mut kept = None;
        loop {
            match next.recv() {
                Ok(Step::Work(scope, reply)) => {
                    if let Some(work) = work.take() {
                        let (answer, local) = work(scope);
                        kept = Some(local);
                        // Gone when the task stopped waiting: the lock was lost meanwhile,
                        // which its outcome says.
                        let _ = reply.send(answer);
                    }
                }
                Ok(Step::Done(joined)) => return (finished(joined), kept),
                Err(_) => return (Err(stopped()), kept),
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.owned.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                // Dropped on an async runtime's thread (a guard dropped by an async
                // task, say), where waiting for the threads to stop would panic.
                runtime.shutdown_background();
            }
            // Elsewhere the drop waits for the runtime's thread to stop.
        }
    }
}
