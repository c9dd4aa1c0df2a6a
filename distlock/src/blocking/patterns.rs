//! The patterns of the blocking client: once per window, idempotent runs, and work
//! under a lock.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use super::runtime::{stopped, CallerThread, Runtime};
use lock_core::{Execution, FencingToken, LockKey, LockScope};

use crate::Result;

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
    pub(super) request: crate::OnceRequest,
    pub(super) runtime: Arc<Runtime>,
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
    /// window. Never waits. [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) on a session-bound store, as for
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
/// [`LockClient::shutdown`](super::LockClient::shutdown) while the job runs) leaves the hold to expire at `at_most`
/// after the start, so nobody runs the job again before then.
#[must_use = "finish the ticket when the job is done"]
#[derive(Debug)]
pub struct OnceTicket {
    pub(super) ticket: crate::OnceTicket,
    pub(super) runtime: Arc<Runtime>,
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
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the hold had already run out (the job ran past
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
    pub(super) request: crate::IdempotentRequest,
    pub(super) runtime: Arc<Runtime>,
}

impl IdempotentRequest {
    /// Identifies the request the work answers: a retry with a different fingerprint is
    /// refused with [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) instead of being replayed another
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
    /// with [`ErrorKind::Lost`](crate::ErrorKind::Lost). The work's own error comes back as
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
