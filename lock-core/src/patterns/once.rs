//! Once per window: run a job at most once per period across replicas.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::capabilities::Capabilities;
use crate::engine::acquire::{acquire_held, Keeping};
use crate::engine::held::HeldLock;
use crate::engine::ClientCore;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::FencingToken;
use crate::values::options::{AcquireOptions, Renewal, Wait};

/// A request for a once-per-window ticket: build it with
/// [`LockClient::once`](crate::LockClient::once), refine it, `.await` it.
///
/// The anti-duplicate lock of scheduled jobs: the caller either gets a [`OnceTicket`] or
/// learns at once (`Ok(None)`) that the key ran, or is running, within the window. It
/// never waits and never renews.
///
/// * [`at_most`](Self::at_most) (default: the client's TTL): if the holder crashes or
///   hangs, the key frees itself this long after the start.
/// * [`at_least`](Self::at_least) (default: zero): the key stays taken at least this long
///   from the start, even if the job finishes sooner, so replicas whose clocks or
///   schedules differ a little do not run it again.
///
/// Both are judged by the store's clock (they are TTLs), never by comparing the callers'
/// clocks. Needs a backend that can keep a hold by its TTL alone
/// ([`Capabilities::once_holds`](crate::Capabilities::once_holds)): its leases live by
/// their TTL, or it is session-bound but can also keep a hold that no session keeps or
/// ends ([`Capabilities::detached_holds`](crate::Capabilities::detached_holds)). Elsewhere
/// the request is refused with [`ErrorKind::Unsupported`], as a session's hold can be
/// neither kept without its session nor shortened.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{LockClient, MemoryBackend};
///
/// let replica_a = LockClient::new(MemoryBackend::new());
/// let replica_b = replica_a.clone();
/// let window = |client: &LockClient| {
///     client
///         .once("reports/nightly")
///         .at_least(Duration::from_secs(60))
///         .at_most(Duration::from_secs(600))
/// };
/// let ticket = window(&replica_a).await?.expect("first in the window");
/// // ... run the job ...
/// ticket.finish().await?;
/// // Finished early: the key stays taken until a minute after the start.
/// assert!(window(&replica_b).await?.is_none());
/// # Ok(())
/// # }
/// ```
#[must_use = "a once request does nothing until awaited"]
#[derive(Debug)]
pub struct OnceRequest {
    core: Arc<ClientCore>,
    key: Result<LockKey>,
    defaults: AcquireOptions,
    at_least: Duration,
    at_most: Option<Duration>,
}

impl OnceRequest {
    pub(crate) fn new(
        core: Arc<ClientCore>,
        key: Result<LockKey>,
        defaults: AcquireOptions,
    ) -> Self {
        OnceRequest {
            core,
            key,
            defaults,
            at_least: Duration::ZERO,
            at_most: None,
        }
    }

    /// The key stays taken at least this long from the start. Default: zero.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = at_least;
        self
    }

    /// The key frees itself at most this long after the start if the ticket is never
    /// finished (a crashed or hung job). Default: the client's TTL.
    pub fn at_most(mut self, at_most: Duration) -> Self {
        self.at_most = Some(at_most);
        self
    }

    async fn take(self) -> Result<Option<OnceTicket>> {
        let key = self.key?;
        let at_most = self.at_most.unwrap_or(self.defaults.ttl);
        if self.at_least > at_most {
            return Err(Error::invalid(format!(
                "at_least {:?} is longer than at_most {:?}",
                self.at_least, at_most
            )));
        }
        let backend = &self.core.backend;
        if !backend.capabilities().once_holds() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "once-per-window holds need a store that keeps a hold by its TTL alone; {} binds every hold to a session",
                    backend.name()
                ),
            ));
        }
        let options = AcquireOptions {
            ttl: padded(backend.capabilities(), at_most),
            wait: Wait::No,
            renewal: Renewal::Manual,
            ..self.defaults
        };
        match acquire_held(&self.core, key, options, Keeping::Detached).await {
            Ok(held) => {
                if let Err(refused) = self.core.leave_to_expire_at_shutdown(&held) {
                    // The client is shutting down and may be giving the hold back already:
                    // the job has not started, so nothing is lost by ending it here too.
                    let _ = held.finish().await;
                    return Err(refused);
                }
                Ok(Some(OnceTicket {
                    held,
                    started: crate::values::clock::now(),
                    at_least: self.at_least,
                    at_most,
                }))
            }
            Err(err) if err.kind() == ErrorKind::HeldByAnother => Ok(None),
            Err(err) => Err(err),
        }
    }
}

impl IntoFuture for OnceRequest {
    type Output = Result<Option<OnceTicket>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.take())
    }
}

/// The right to run a once-per-window job; see [`OnceRequest`].
///
/// [`finish`](Self::finish) it when the job is done. Dropping it without finishing leaves
/// the hold to expire at `at_most` after the start: the safe default for a job that
/// crashed, as nobody runs it again before then.
///
/// [`LockClient::shutdown`](crate::LockClient::shutdown) leaves an unfinished ticket's
/// hold in the store the same way, rather than giving it back: the job may still be
/// running, and a released key would let another replica start it again within the
/// window. The ticket stays usable: finishing it after the shutdown frees the key as
/// usual (at `start + at_least`).
#[derive(Debug)]
#[must_use = "finish the ticket when the job is done"]
pub struct OnceTicket {
    held: Arc<HeldLock>,
    /// When the grant reached us: no earlier than the store's start of the hold, so
    /// `at_least` measured from here keeps the key at least that long by the store's clock.
    started: Instant,
    at_least: Duration,
    at_most: Duration,
}

impl OnceTicket {
    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.held.key
    }

    /// The fencing token of this run: pass it to every resource the job writes.
    pub fn token(&self) -> FencingToken {
        self.held.token
    }

    /// Whether the hold is still ahead of its local deadline (`at_most`, less the drift
    /// allowance). A job still running after that is no longer protected.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Resolves when the hold runs out (`at_most` passed) before the ticket is finished.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move { held.wait_lost().await }
    }

    /// The job is done: frees the key at `start + at_least`, at once if that has passed.
    ///
    /// [`ErrorKind::Lost`] when the hold had already run out (the job ran past
    /// `at_most`, so another replica may have started it).
    pub async fn finish(self) -> Result<()> {
        let left = self
            .at_least
            .saturating_sub(crate::values::clock::since(self.started));
        if left.is_zero() {
            return self.held.finish().await;
        }
        if self.at_least >= self.at_most {
            // The hold already ends at `at_least`.
            return self.held.leave_to_expire(None).await;
        }
        let capabilities = self.held.backend().capabilities();
        let ttl = padded(capabilities, left.max(capabilities.min_ttl));
        self.held.leave_to_expire(Some(ttl)).await
    }
}

/// A store may read its clock in whole steps, truncated, so a hold asked for `ttl` can end
/// up to one [`clock_step`](Capabilities::clock_step) before `ttl` has really passed since
/// its start. One step more keeps `at_least` and `at_most` by real time (unless that would
/// pass `max_ttl`). Not a TTL granularity step: a store with whole-second TTLs and a fine
/// clock (etcd) would hold a second past `at_most`.
fn padded(capabilities: &Capabilities, ttl: Duration) -> Duration {
    let padded = capabilities
        .store_ttl(ttl)
        .saturating_add(capabilities.clock_step);
    if padded <= capabilities.max_ttl {
        padded
    } else {
        ttl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_once_hold_is_one_clock_step_longer_unless_that_passes_max_ttl() {
        let caps = Capabilities {
            ttl_granularity: Duration::from_millis(1),
            max_ttl: Duration::from_secs(10),
            ..Capabilities::default()
        };
        assert_eq!(
            padded(&caps, Duration::from_millis(400)),
            Duration::from_millis(401)
        );
        assert_eq!(
            padded(&caps, Duration::from_micros(400_500)),
            Duration::from_millis(402)
        );
        assert_eq!(
            padded(&caps, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn a_fine_clock_pads_nothing_whatever_the_ttl_granularity() {
        let caps = Capabilities {
            ttl_granularity: Duration::from_secs(1),
            clock_step: Duration::ZERO,
            ..Capabilities::default()
        };
        assert_eq!(
            padded(&caps, Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        assert_eq!(
            padded(&caps, Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
    }
}

#[cfg(test)]
mod shutdown_tests {
    use std::time::Duration;

    use crate::{LockClient, MemoryBackend};

    /// A shutdown while the job runs must not hand the window to another replica: the
    /// job may still be running. Finishing the ticket afterwards frees the key as usual.
    #[tokio::test]
    async fn shutdown_leaves_a_running_ticket_in_the_store() {
        let store = MemoryBackend::new();
        let (replica_a, replica_b) = (LockClient::new(store.clone()), LockClient::new(store));
        let ticket = replica_a
            .once("nightly")
            .at_most(Duration::from_secs(600))
            .await
            .unwrap()
            .expect("first in the window");
        replica_a.shutdown().await.unwrap();
        assert!(
            replica_b.once("nightly").await.unwrap().is_none(),
            "another replica got the window while the first job may still run"
        );
        assert!(ticket.is_held());
        ticket.finish().await.unwrap();
        replica_b
            .once("nightly")
            .await
            .unwrap()
            .expect("free once the job finished")
            .finish()
            .await
            .unwrap();
    }
}
