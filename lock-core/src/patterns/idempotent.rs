//! Idempotent execution: run a piece of work once per business key, however often it is
//! retried, and replay its recorded result to every retry.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{with_timeout, Ownership, Record};
use crate::client::guard::LockGuard;
use crate::client::request::LockRequest;
use crate::engine::ClientCore;
use crate::patterns::scoped::LockScope;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::options::{AcquireOptions, Backoff, Wait};

/// How long a result is kept for retries unless set: one day.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// What an idempotent call did, with the result `T`: bytes from
/// [`run`](IdempotentRequest::run), a value of the caller's type from `run_json` (with
/// the `serde` feature).
///
/// Only `Ran` and `Replayed` carry a result; a caller that goes on after `?` without
/// looking at the variant treats `InProgress` and `Failed` as success.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "the work may not have run (InProgress) or may have failed (Failed): match on the outcome"]
pub enum Execution<E, T = Vec<u8>> {
    /// This call ran the work, and its result is recorded for retries.
    Ran(T),
    /// The work had already completed: its recorded result, without running it again.
    Replayed(T),
    /// Another caller is running the work right now (and this call did not wait, or not
    /// long enough, for it to finish).
    InProgress,
    /// This call ran the work and it failed. Nothing was recorded: the next call runs it
    /// again.
    Failed(E),
}

/// An idempotent run of a piece of work for one key: build it with
/// [`LockClient::idempotent`](crate::LockClient::idempotent), refine it, then
/// [`run`](Self::run) the work.
///
/// The run:
/// 1. reads the key's result record: if the work already completed, its result is
///    replayed at the cost of that one round trip, and no lock is taken;
/// 2. otherwise takes the key's lock (not waiting by default: a key being worked on is
///    [`Execution::InProgress`]);
/// 3. reads the record again under the lock, which closes the window in which two
///    callers both saw "not done";
/// 4. runs the work, and records its result **fenced**: the store writes it only while
///    this caller still holds the lock, in one atomic step, so a caller whose lock ran
///    out cannot record over the next holder's result (it gets
///    [`ErrorKind::Lost`] instead);
/// 5. releases the lock.
///
/// A failed run ([`Execution::Failed`]) records nothing, so the next call runs the work
/// again. The work is not stopped when the lock is lost (use
/// [`LockClient::with_lock`](crate::LockClient::with_lock) inside it for that); its
/// result is then refused. Records are kept for at least the
/// [`retention`](Self::retention) period (a store may keep one a little longer: etcd up to
/// an eighth of it, its docs say why) and then forgotten by the store: a retry after that
/// runs the work again.
///
/// Needs a backend with [`Capabilities::records`](crate::Capabilities::records); others
/// refuse with [`ErrorKind::Unsupported`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use lock_core::{Execution, LockClient, MemoryBackend};
///
/// let client = LockClient::new(MemoryBackend::new());
/// let charge = || async { Ok::<_, String>(b"charged 10 EUR".to_vec()) };
///
/// let first = client.idempotent("payment/4711").fingerprint(b"10 EUR").run(|_| charge()).await?;
/// assert_eq!(first, Execution::Ran(b"charged 10 EUR".to_vec()));
/// // A retry replays the result without charging again.
/// let retry = client.idempotent("payment/4711").fingerprint(b"10 EUR").run(|_| charge()).await?;
/// assert_eq!(retry, Execution::Replayed(b"charged 10 EUR".to_vec()));
/// // The same key with a different request is refused, not replayed.
/// let other = client.idempotent("payment/4711").fingerprint(b"99 EUR").run(|_| charge()).await;
/// assert_eq!(other.unwrap_err().kind(), lock_core::ErrorKind::InvalidInput);
/// # Ok(())
/// # }
/// ```
#[must_use = "an idempotent request does nothing until run"]
#[derive(Debug)]
pub struct IdempotentRequest {
    core: Arc<ClientCore>,
    key: Result<LockKey>,
    /// For the lock the work runs under.
    options: AcquireOptions,
    fingerprint: Option<Vec<u8>>,
    retention: Duration,
}

impl IdempotentRequest {
    pub(crate) fn new(
        core: Arc<ClientCore>,
        key: Result<LockKey>,
        defaults: AcquireOptions,
    ) -> Self {
        IdempotentRequest {
            core,
            key,
            options: AcquireOptions {
                wait: Wait::No,
                ..defaults
            },
            fingerprint: None,
            retention: DEFAULT_RETENTION,
        }
    }

    /// Identifies the request the work answers (a hash of its input, say): a retry with a
    /// different fingerprint is refused with [`ErrorKind::InvalidInput`] instead of being
    /// replayed another request's result.
    pub fn fingerprint(mut self, fingerprint: impl AsRef<[u8]>) -> Self {
        self.fingerprint = Some(fingerprint.as_ref().to_vec());
        self
    }

    /// How long the store keeps the result for retries, at least. Default: one day. Zero, or more
    /// than [`MAX_RETENTION`](crate::backend::MAX_RETENTION), is
    /// [`ErrorKind::InvalidInput`] when the request runs.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Waits up to `bound` for another caller's run to finish (then replays its result,
    /// or runs the work if that run failed) instead of answering
    /// [`Execution::InProgress`] at once.
    pub fn wait_up_to(mut self, bound: Duration) -> Self {
        self.options.wait = Wait::UpTo(bound);
        self
    }

    /// The TTL of the lock the work runs under (renewed automatically while it runs).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = ttl;
        self
    }

    /// Runs `work` unless its result is already recorded; see the type's docs.
    ///
    /// The work gets the [`LockScope`] it runs under (for its fencing token) and returns
    /// its result as bytes, or its own error.
    pub async fn run<F, Fut, E>(self, work: F) -> Result<Execution<E>>
    where
        F: FnOnce(LockScope) -> Fut,
        Fut: Future<Output = std::result::Result<Vec<u8>, E>>,
    {
        let key = self.key?;
        let backend = &self.core.backend;
        let caps = backend.capabilities();
        if !caps.records {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{} keeps no idempotency records{}",
                    backend.name(),
                    caps.records_hint
                        .map(|hint| format!(": {hint}"))
                        .unwrap_or_default()
                ),
            ));
        }
        if self.retention.is_zero() {
            return Err(Error::invalid(
                "retention is zero: nothing would be replayed",
            ));
        }
        // Refused before anything is locked or run, not when the result is written.
        Record::retention_millis(self.retention)?;
        let run = IdempotentRun {
            core: self.core,
            key,
            request_timeout: self.options.request_timeout,
            backoff: self.options.backoff,
            fingerprint: self.fingerprint,
            retention: self.retention,
        };
        // Already done: one round trip, and no lock taken.
        if let Some(record) = run.read().await? {
            return run.replay(record);
        }
        let lock = LockRequest::new(
            Arc::clone(&run.core),
            None,
            Ok(run.key.clone()),
            self.options,
        );
        let guard = match lock.await {
            Ok(guard) => guard,
            Err(err) if matches!(err.kind(), ErrorKind::HeldByAnother | ErrorKind::TimedOut) => {
                return Ok(Execution::InProgress)
            }
            Err(err) => return Err(err),
        };
        run.run_locked(guard, work).await
    }

    /// [`run`](Self::run) for work whose result is any value serde can encode: the result
    /// is recorded as JSON and decoded for every caller, this one included, so the first
    /// run and every retry see the same value. Needs the `serde` cargo feature.
    ///
    /// A result that does not encode as JSON (a map with non-string keys, say) is
    /// [`ErrorKind::InvalidInput`] after the work ran, and nothing is recorded: the next
    /// call runs the work again. A recorded result that does not decode as `T` (recorded
    /// by another version of the type, or as other bytes by [`run`](Self::run)) is
    /// [`ErrorKind::InvalidInput`] until the record's [`retention`](Self::retention) ends;
    /// a result type that changes incompatibly needs keys of its own.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use lock_core::{Execution, LockClient, MemoryBackend};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Debug, PartialEq, Serialize, Deserialize)]
    /// struct Receipt {
    ///     charged_cents: u64,
    ///     reference: String,
    /// }
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let charge = || async {
    ///     Ok::<_, String>(Receipt { charged_cents: 1000, reference: "tx-81".into() })
    /// };
    /// let first = client.idempotent("payment/4711").run_json(|_| charge()).await?;
    /// let retry = client.idempotent("payment/4711").run_json(|_| charge()).await?;
    /// match (first, retry) {
    ///     (Execution::Ran(ran), Execution::Replayed(replayed)) => assert_eq!(ran, replayed),
    ///     other => panic!("expected a run and a replay, got {other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "serde")]
    pub async fn run_json<F, Fut, T, E>(self, work: F) -> Result<Execution<E, T>>
    where
        F: FnOnce(LockScope) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let key = self
            .key
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let execution = self
            .run(|scope| async move {
                let value = work(scope).await.map_err(JsonWork::Failed)?;
                serde_json::to_vec(&value).map_err(JsonWork::Encode)
            })
            .await?;
        let decode = |bytes: Vec<u8>| {
            serde_json::from_slice::<T>(&bytes).map_err(|err| {
                Error::invalid(format!(
                    "the recorded result of {key:?} does not decode as {}: {err}",
                    std::any::type_name::<T>()
                ))
                .with_source(err)
            })
        };
        Ok(match execution {
            Execution::Ran(bytes) => Execution::Ran(decode(bytes)?),
            Execution::Replayed(bytes) => Execution::Replayed(decode(bytes)?),
            Execution::InProgress => Execution::InProgress,
            Execution::Failed(JsonWork::Failed(err)) => Execution::Failed(err),
            Execution::Failed(JsonWork::Encode(err)) => {
                return Err(Error::invalid(format!(
                    "the work for {key:?} ran but its result does not encode as JSON, so \
                     nothing was recorded: {err}"
                ))
                .with_source(err))
            }
        })
    }
}

/// How work run by [`IdempotentRequest::run_json`] failed: by its own error, or by a
/// result that does not encode.
#[cfg(feature = "serde")]
enum JsonWork<E> {
    Failed(E),
    Encode(serde_json::Error),
}

/// The part of a run that happens under the lock.
struct IdempotentRun {
    core: Arc<ClientCore>,
    key: LockKey,
    request_timeout: Duration,
    backoff: Backoff,
    fingerprint: Option<Vec<u8>>,
    retention: Duration,
}

impl IdempotentRun {
    async fn run_locked<F, Fut, E>(self, guard: LockGuard, work: F) -> Result<Execution<E>>
    where
        F: FnOnce(LockScope) -> Fut,
        Fut: Future<Output = std::result::Result<Vec<u8>, E>>,
    {
        // The double check: a run may have completed between the first read and the lock.
        let recorded = match self.read().await {
            Ok(recorded) => recorded,
            Err(err) => {
                release_quietly(guard).await;
                return Err(err);
            }
        };
        if let Some(record) = recorded {
            release_quietly(guard).await;
            return self.replay(record);
        }
        let value = match work(LockScope::new(guard.held().clone())).await {
            Ok(value) => value,
            Err(err) => {
                release_quietly(guard).await;
                return Ok(Execution::Failed(err));
            }
        };
        let record = Record {
            value,
            fingerprint: self.fingerprint.clone(),
            token: guard.token(),
        };
        let written = self.write(&guard, &record).await;
        match written {
            // Written while held, so the result stands even if the lease runs out before
            // the release below.
            Ok(Ownership::Held) => {
                release_quietly(guard).await;
                Ok(Execution::Ran(record.value))
            }
            Ok(Ownership::NotHeld) => {
                release_quietly(guard).await;
                Err(Error::lost(format!(
                    "the lock on {:?} was lost before the result was recorded; the result was refused",
                    self.key.as_str()
                )))
            }
            Err(err) => {
                release_quietly(guard).await;
                Err(err)
            }
        }
    }
}

impl IdempotentRun {
    /// Records the result under `guard`'s lease ([`write_fenced`]).
    async fn write(&self, guard: &LockGuard, record: &Record) -> Result<Ownership> {
        write_fenced(
            &self.core.backend,
            guard,
            record,
            self.retention,
            (self.request_timeout, self.backoff),
        )
        .await
    }

    async fn read(&self) -> Result<Option<Record>> {
        with_timeout(
            self.core.backend.name(),
            self.request_timeout,
            "read_record",
            self.core.backend.read_record(&self.key),
        )
        .await
    }

    /// The recorded result, unless it answered a different request.
    fn replay<E>(&self, record: Record) -> Result<Execution<E>> {
        match &self.fingerprint {
            Some(wanted) if record.fingerprint.as_ref() != Some(wanted) => Err(Error::invalid(
                "the recorded run answered a request with a different fingerprint",
            )),
            _ => Ok(Execution::Replayed(record.value)),
        }
    }
}

/// Writes `record` for `guard`'s key under its lease, fenced by the store:
/// [`Ownership::NotHeld`] when the lease is lost (known here already, or found by the
/// store's fence). An unanswered write is retried, pausing per `backoff`, while the lease
/// is valid (the write is idempotent); each try takes at most `request_timeout`.
pub(crate) async fn write_fenced(
    backend: &crate::backend::DynBackend,
    guard: &LockGuard,
    record: &Record,
    retention: Duration,
    (request_timeout, backoff): (Duration, Backoff),
) -> Result<Ownership> {
    let mut attempt = 0;
    loop {
        let lease = guard.lease();
        if !guard.is_held() {
            return Ok(Ownership::NotHeld);
        }
        let written = with_timeout(
            backend.name(),
            request_timeout.min(lease.remaining()),
            "write_record",
            backend.write_record(guard.key(), lease.id(), record, retention),
        )
        .await;
        match written {
            Err(err) if err.kind() == ErrorKind::Unavailable && guard.is_held() => {
                tracing::debug!(key = %guard.key(), error = %err, "record write unanswered; retrying");
                tokio::time::sleep(backoff.pause(attempt).min(lease.remaining())).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Gives the lock back; the outcome of the run is already decided, so a release that
/// finds the lease lost changes nothing for the caller (it is logged).
async fn release_quietly(guard: LockGuard) {
    let key = guard.key().clone();
    if let Err(err) = guard.release().await {
        tracing::debug!(%key, error = %err, "release after an idempotent run: {err}");
    }
}

#[cfg(all(test, feature = "serde"))]
mod json_tests {
    use std::collections::HashMap;

    use serde::{Deserialize, Serialize};

    use crate::{ErrorKind, Execution, LockClient, MemoryBackend};

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Receipt {
        cents: u64,
        reference: String,
    }

    fn receipt() -> Receipt {
        Receipt {
            cents: 1000,
            reference: "tx-81".into(),
        }
    }

    /// The first run and the retry see the same typed value, and the retry does not run
    /// the work.
    #[tokio::test]
    async fn a_typed_result_is_replayed() {
        let client = LockClient::new(MemoryBackend::new());
        let first = client
            .idempotent("k")
            .run_json(|_| async { Ok::<_, String>(receipt()) })
            .await
            .unwrap();
        assert_eq!(first, Execution::Ran(receipt()));
        let retry = client
            .idempotent("k")
            .run_json(|_| async { Err::<Receipt, _>("ran again".to_string()) })
            .await
            .unwrap();
        assert_eq!(retry, Execution::Replayed(receipt()));
    }

    /// The work's own error comes back as `Failed`, nothing is recorded, and the next
    /// call runs the work.
    #[tokio::test]
    async fn a_failed_run_records_nothing() {
        let client = LockClient::new(MemoryBackend::new());
        let failed = client
            .idempotent("k")
            .run_json(|_| async { Err::<Receipt, _>("card declined") })
            .await
            .unwrap();
        assert_eq!(failed, Execution::Failed("card declined"));
        let next = client
            .idempotent("k")
            .run_json(|_| async { Ok::<_, String>(receipt()) })
            .await
            .unwrap();
        assert_eq!(next, Execution::Ran(receipt()));
    }

    /// A result JSON cannot encode is an error naming the key, and leaves no record.
    #[tokio::test]
    async fn a_result_that_does_not_encode_is_refused_and_not_recorded() {
        let client = LockClient::new(MemoryBackend::new());
        let unencodable = HashMap::from([((1u8, 2u8), 3u8)]);
        let err = client
            .idempotent("tuple-keys")
            .run_json(|_| async { Ok::<_, String>(unencodable) })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("tuple-keys"), "{err}");
        let next = client
            .idempotent("tuple-keys")
            .run(|_| async { Ok::<_, String>(b"raw".to_vec()) })
            .await
            .unwrap();
        assert_eq!(next, Execution::Ran(b"raw".to_vec()));
    }

    /// Bytes recorded by `run` that are not a `T` in JSON are an error, not a panic or a
    /// rerun.
    #[tokio::test]
    async fn a_record_of_another_type_is_refused() {
        let client = LockClient::new(MemoryBackend::new());
        let raw = client
            .idempotent("k")
            .run(|_| async { Ok::<_, String>(b"not json".to_vec()) })
            .await
            .unwrap();
        assert_eq!(raw, Execution::Ran(b"not json".to_vec()));
        let err = client
            .idempotent("k")
            .run_json(|_| async { Ok::<_, String>(receipt()) })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("Receipt"), "{err}");
    }
}
