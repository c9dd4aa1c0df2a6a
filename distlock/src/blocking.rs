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

#![cfg(feature = "blocking")]
#![cfg_attr(docsrs, doc(cfg(feature = "blocking")))]

use std::future::{Future, IntoFuture};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use lock_core::{Capabilities, FencingToken, LockKey, LockStatus, LossReason, Wait};

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

    /// Gives back every lease this client and its clones hold, and refuses further
    /// acquisitions; see [`LockClient::shutdown`](crate::LockClient::shutdown).
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
        match outcome.recv() {
            Ok(Ok(result)) => result,
            Ok(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            // Tasks are cancelled only by the runtime's shutdown, which waits for the
            // last handle, and `self` is one.
            Ok(Err(_)) | Err(_) => Err(Error::new(
                ErrorKind::Internal,
                "the blocking client's runtime stopped during a request",
            )),
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
