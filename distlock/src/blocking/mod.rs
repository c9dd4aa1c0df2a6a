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
//! while the work runs is reported when it returns, as [`ErrorKind::Lost`](crate::ErrorKind::Lost).

#![cfg(feature = "blocking")]
#![cfg_attr(docsrs, doc(cfg(feature = "blocking")))]

use std::sync::Arc;

use lock_core::{Capabilities, LockScope, LockStatus};

use crate::Result;

mod lock;
mod patterns;
mod runtime;

pub use lock::{LockGuard, LockRequest};
pub use patterns::{IdempotentRequest, OnceRequest, OnceTicket};
use runtime::Runtime;

/// A client for the store named by `url`, as [`crate::connect`] gives, over a runtime of
/// its own. Fails as `connect` does, or with [`ErrorKind::Internal`](crate::ErrorKind::Internal) if the runtime's
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
        self.request(self.client.lock(key))
    }

    /// A request for `key` that does not wait: a held key is
    /// [`ErrorKind::HeldByAnother`](crate::ErrorKind::HeldByAnother).
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.lock(key).no_wait()
    }

    /// A request for one of `permits` permits of the semaphore `key`; see
    /// [`LockClient::semaphore`](crate::LockClient::semaphore).
    ///
    /// ```
    /// # fn main() -> distlock::Result<()> {
    /// let client = distlock::blocking::connect("memory://blocking-semaphore")?;
    /// let first = client.semaphore("encoders", 2).acquire()?;
    /// let second = client.semaphore("encoders", 2).acquire()?;
    /// assert!(client.semaphore("encoders", 2).no_wait().acquire().is_err());
    /// first.release()?;
    /// second.release()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, key: impl AsRef<str>, permits: u32) -> LockRequest {
        self.request(self.client.semaphore(key, permits))
    }

    /// A request for the read side of the reader-writer lock `key`; see
    /// [`LockClient::read_lock`](crate::LockClient::read_lock).
    pub fn read_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.request(self.client.read_lock(key))
    }

    /// A request for the write side of the reader-writer lock `key`; see
    /// [`LockClient::write_lock`](crate::LockClient::write_lock).
    pub fn write_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.request(self.client.write_lock(key))
    }

    fn request(&self, request: crate::LockRequest) -> LockRequest {
        LockRequest {
            request,
            runtime: Arc::clone(&self.runtime),
        }
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
