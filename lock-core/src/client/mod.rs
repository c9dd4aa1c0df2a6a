//! What users call: a client over any backend.

pub(crate) mod guard;
pub(crate) mod owner;
pub(crate) mod request;
pub(crate) mod set;
pub(crate) mod status;

pub use guard::LockGuard;
/// One permit of a counting semaphore ([`LockClient::semaphore`]): a guard like a lock's,
/// with the permit's own lease and fencing token.
pub type Permit = LockGuard;
pub use owner::LockOwner;
pub use request::LockRequest;
pub use set::{LockSet, LockSetRequest};
pub use status::LockStatus;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{with_timeout, DynBackend, LockBackend};
use crate::engine::ClientCore;
use tracing::Instrument;

use crate::patterns::election::{CampaignRequest, Candidate, LeaderChanges, LeaderStatus};
use crate::patterns::idempotent::IdempotentRequest;
use crate::patterns::once::OnceRequest;
use crate::patterns::scoped::LockScope;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::{HoldKind, LockKey, Primitive};
use crate::values::lease::FencingToken;
use crate::values::options::AcquireOptions;

/// Locks keys on one backend. Cheap to clone; clones share the backend and one renewal
/// engine, which keeps every lock the client holds alive with a single task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{LockClient, MemoryBackend};
///
/// let client = LockClient::new(MemoryBackend::new());
/// let guard = client.lock("reports/daily").ttl(Duration::from_secs(10)).await?;
/// // Refused at once while held: waiting is opt-in per request.
/// assert!(client.try_lock("reports/daily").await.is_err());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockClient {
    core: Arc<ClientCore>,
    defaults: AcquireOptions,
}

impl LockClient {
    /// A client over `backend` with default options: a backend of any type, or one
    /// already shared (the [`DynBackend`] a backend crate's `connect` returns), which is
    /// used as it is.
    pub fn new(backend: impl LockBackend) -> Self {
        LockClient {
            core: Arc::new(ClientCore::new(shared(backend))),
            defaults: AcquireOptions::default(),
        }
    }

    /// Replaces the options requests start from.
    pub fn with_defaults(mut self, defaults: AcquireOptions) -> Self {
        self.defaults = defaults;
        self
    }

    /// The options requests start from.
    pub fn defaults(&self) -> &AcquireOptions {
        &self.defaults
    }

    /// What the store behind this client promises and where its limits are (fairness,
    /// notification, durable tokens, TTL range, records, sessions): the properties that
    /// differ between stores, for code that relies on one of them.
    pub fn capabilities(&self) -> &crate::Capabilities {
        self.core.backend.capabilities()
    }

    /// A request for `key` with this client's default options, to refine and `.await`.
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest {
        LockRequest::new(
            Arc::clone(&self.core),
            None,
            LockKey::new(key),
            self.defaults.clone(),
        )
    }

    /// A request for `key` that does not wait: a held key is
    /// [`ErrorKind::HeldByAnother`](crate::ErrorKind). On a fair backend it never jumps
    /// the queue: while anyone waits for the key, it is refused too.
    pub fn try_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.lock(key).no_wait()
    }

    /// A request for one permit of the counting semaphore `key`, which admits `permits`
    /// holders at once: refine it like [`lock`](Self::lock)'s and `.await` it for a
    /// [`Permit`](crate::Permit). Each permit is a lease of its own, with its own fencing
    /// token (greater than every token granted before for the semaphore), renewed and
    /// watched like a lock's.
    ///
    /// The limit belongs to the semaphore while anyone holds or waits for it: a request
    /// with another limit meanwhile is [`ErrorKind::InvalidInput`](crate::ErrorKind),
    /// naming both. To change the limit, let every holder release (or use a new key).
    /// Zero permits is `InvalidInput` too. A store without semaphores refuses with
    /// [`ErrorKind::Unsupported`](crate::ErrorKind) (Redlock: a majority of nodes cannot
    /// count holders).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use lock_core::{ErrorKind, LockClient, MemoryBackend};
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let first = client.semaphore("gpu", 2).await?;
    /// let second = client.semaphore("gpu", 2).await?;
    /// let third = client.semaphore("gpu", 2).no_wait().await;
    /// assert_eq!(third.unwrap_err().kind(), ErrorKind::HeldByAnother);
    /// assert!(second.token() > first.token());
    /// first.release().await?;
    /// second.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, key: impl AsRef<str>, permits: u32) -> LockRequest {
        self.held_as(key, HoldKind::Permit { limit: permits })
    }

    /// A request for the read (shared) side of the reader-writer lock `key`: held by many
    /// readers at once, never while a writer holds it. A writer that waits goes first:
    /// readers that come after it wait until it has had its turn, so readers that keep
    /// overlapping cannot starve it. A read grant's token is at least the last writer's.
    pub fn read_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.held_as(key, HoldKind::Read)
    }

    /// A request for the write (exclusive) side of the reader-writer lock `key`: granted
    /// when nobody holds it, read or write. A write grant's token is greater than every
    /// token granted before for the lock, read or write.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use lock_core::{LockClient, MemoryBackend};
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let reader = client.read_lock("catalog").await?;
    /// let another = client.read_lock("catalog").await?;
    /// assert!(client.write_lock("catalog").no_wait().await.is_err());
    /// reader.release().await?;
    /// let last_read = another.token();
    /// another.release().await?;
    /// let writer = client.write_lock("catalog").no_wait().await?;
    /// assert!(writer.token() > last_read);
    /// writer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_lock(&self, key: impl AsRef<str>) -> LockRequest {
        self.held_as(key, HoldKind::Write)
    }

    /// A request for every key of `keys` as one: all or none. Refine it like
    /// [`lock`](Self::lock)'s (the options apply to every key; the wait bounds the whole
    /// set) and `.await` it for a [`LockSet`], which holds a lease and token per key and
    /// gives them back together.
    ///
    /// The keys are taken one at a time in sorted order (each once), so callers whose
    /// sets overlap cannot deadlock; a set that cannot be completed within its wait gives
    /// back what it had taken. An empty set is
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use lock_core::{LockClient, MemoryBackend};
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let transfer = client.lock_all(["accounts/b", "accounts/a"]).await?;
    /// assert_eq!(transfer.keys().map(|key| key.as_str()).collect::<Vec<_>>(), ["accounts/a", "accounts/b"]);
    /// assert!(client.try_lock("accounts/a").await.is_err());
    /// transfer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all<I, K>(&self, keys: I) -> LockSetRequest
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        LockRequest::new(
            Arc::clone(&self.core),
            None,
            set::canonical(keys),
            self.defaults.clone(),
        )
    }

    fn held_as(&self, key: impl AsRef<str>, kind: HoldKind) -> LockRequest {
        LockRequest::new(
            Arc::clone(&self.core),
            None,
            LockKey::new(key).and_then(|key| key.held_as(kind)),
            self.defaults.clone(),
        )
    }

    /// Every live holder of `key` as `primitive` (the mutex, the semaphore or the
    /// reader-writer lock of that name), oldest grant first, with what
    /// [`inspect`](Self::inspect) tells of each and how it holds the key
    /// ([`LockStatus::kind`]). Empty when nobody holds it.
    pub async fn holders(
        &self,
        key: impl AsRef<str>,
        primitive: Primitive,
    ) -> Result<Vec<LockStatus>> {
        let kind = match primitive {
            Primitive::Mutex => HoldKind::Mutex,
            // The limit does not matter to a look at the holders.
            Primitive::Semaphore => HoldKind::Permit { limit: 1 },
            Primitive::RwLock => HoldKind::Read,
        };
        let key = LockKey::new(key)?.held_as(kind)?;
        self.core
            .backend
            .capabilities()
            .check_kind(self.core.backend.name(), &key)?;
        let holders = with_timeout(
            self.core.backend.name(),
            self.defaults.request_timeout,
            "holders",
            self.core.backend.holders(&key),
        )
        .await?;
        Ok(holders.into_iter().map(LockStatus::from).collect())
    }

    /// Who holds `key` right now: token, remaining TTL, waiters and label where the store
    /// knows them. Never the holder's lease id.
    pub async fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockStatus>> {
        let key = LockKey::new(key)?;
        let info = with_timeout(
            self.core.backend.name(),
            self.defaults.request_timeout,
            "inspect",
            self.core.backend.inspect(&key),
        )
        .await?;
        Ok(info.map(LockStatus::from))
    }

    /// The keys starting with `prefix` that are held right now, with what
    /// [`inspect`](Self::inspect) tells of each, at most `limit` of them, in key order:
    /// for an operator looking for a stuck key. [`ErrorKind::Unsupported`] on a backend
    /// that cannot list its keys.
    ///
    /// [`ErrorKind::Unsupported`]: crate::ErrorKind::Unsupported
    pub async fn list(
        &self,
        prefix: impl AsRef<str>,
        limit: usize,
    ) -> Result<Vec<(LockKey, LockStatus)>> {
        let held = with_timeout(
            self.core.backend.name(),
            self.defaults.request_timeout,
            "list_held",
            self.core.backend.list_held(prefix.as_ref(), limit),
        )
        .await?;
        Ok(held
            .into_iter()
            .map(|(key, info)| (key, LockStatus::from(info)))
            .collect())
    }

    /// Releases `key` on behalf of its holder, identified by its fencing `token` (what
    /// [`inspect`](Self::inspect) or [`list`](Self::list) shows): the way out of a key
    /// whose holder is stuck but alive and renewing. Refused with
    /// [`ErrorKind::HeldByAnother`] when the key is held under another token (it moved
    /// on), and with [`ErrorKind::InvalidInput`] when nobody holds it. A holder whose
    /// lease is renewed per key learns of it at its next renewal, as of any loss; on a
    /// session store (etcd, ZooKeeper), whose leases are kept by the session rather than
    /// one by one, only at its release. Until then it may still act: whatever it does is
    /// fenced out by the next holder's greater token, and only that.
    ///
    /// [`ErrorKind::HeldByAnother`]: crate::ErrorKind::HeldByAnother
    /// [`ErrorKind::InvalidInput`]: crate::ErrorKind::InvalidInput
    pub async fn break_lock(&self, key: impl AsRef<str>, token: FencingToken) -> Result<()> {
        let key = LockKey::new(key)?;
        let backend = &self.core.backend;
        let timeout = self.defaults.request_timeout;
        let span = tracing::info_span!("distlock.break", backend = backend.name(), key = %key, %token, outcome = tracing::field::Empty);
        let result = async {
            let holder =
                with_timeout(backend.name(), timeout, "inspect", backend.inspect(&key)).await?;
            let Some(holder) = holder else {
                return Err(Error::invalid(format!("{:?} is not held", key.as_str())));
            };
            if holder.token != token {
                return Err(Error::new(
                    ErrorKind::HeldByAnother,
                    format!(
                        "{:?} is held under token {}, not {token}: the lock moved on",
                        key.as_str(),
                        holder.token
                    ),
                ));
            }
            // By lease id: whatever happened since the look, no later holder is touched.
            let released = with_timeout(
                backend.name(),
                timeout,
                "release",
                backend.release(&key, holder.lease_id),
            )
            .await?;
            if released.is_held() {
                tracing::warn!(key = %key, %token, "lock broken by an operator");
                Ok(())
            } else {
                Err(Error::new(
                    ErrorKind::HeldByAnother,
                    format!(
                        "{:?}: the holder of token {token} let go or expired meanwhile",
                        key.as_str()
                    ),
                ))
            }
        }
        .instrument(span.clone())
        .await;
        span.record("outcome", crate::engine::outcome_name(&result));
        result
    }

    /// A once-per-window ticket for `key`: the job runs on whichever replica gets it, and
    /// nobody runs it again within the window. See [`OnceRequest`].
    pub fn once(&self, key: impl AsRef<str>) -> OnceRequest {
        OnceRequest::new(
            Arc::clone(&self.core),
            LockKey::new(key),
            self.defaults.clone(),
        )
    }

    /// An idempotent run of a piece of work for `key`: at most one result is recorded,
    /// however often it is retried, and retries get the recorded result. The work itself
    /// may run again after a crash or a lost lease mid-run, so fence what it writes with
    /// the scope's token. See [`IdempotentRequest`].
    pub fn idempotent(&self, key: impl AsRef<str>) -> IdempotentRequest {
        IdempotentRequest::new(
            Arc::clone(&self.core),
            LockKey::new(key),
            self.defaults.clone(),
        )
    }

    /// A campaign to lead the election `name`: refine it like [`lock`](Self::lock)'s,
    /// give it a [`value`](CampaignRequest::value), and `.await` it (by default for as long
    /// as it takes) for a [`Leadership`](crate::Leadership). On a fair store candidates are elected in the
    /// order they started campaigning; a campaign dropped or cancelled leaves nothing
    /// behind.
    ///
    /// The leader holds the lock `name` (an election and the lock of its name are the
    /// same key: `inspect` and `distlock status` show the leader's term as its token), and
    /// its value is `name`'s idempotency record, written fenced by its lease. A store
    /// without records (Redlock) refuses with
    /// [`ErrorKind::Unsupported`](crate::ErrorKind).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use lock_core::{LockClient, MemoryBackend};
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let leadership = client.elect("scheduler").value("10.0.0.7:8080").await?;
    /// let leader = client.leader("scheduler").await?.expect("a leader");
    /// assert_eq!(leader.term, leadership.term());
    /// assert_eq!(leader.value.as_deref(), Some(&b"10.0.0.7:8080"[..]));
    /// leadership.resign().await?;
    /// assert!(client.leader("scheduler").await?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn elect(&self, name: impl AsRef<str>) -> CampaignRequest {
        LockRequest::new(
            Arc::clone(&self.core),
            None,
            LockKey::new(name).map(Candidate::new),
            AcquireOptions {
                wait: crate::Wait::Forever,
                ..self.defaults.clone()
            },
        )
    }

    /// Who leads the election `name` now: term, value, label and time left, or `None`.
    pub async fn leader(&self, name: impl AsRef<str>) -> Result<Option<LeaderStatus>> {
        let name = LockKey::new(name)?;
        crate::patterns::election::leader(&self.core, &name, self.defaults.request_timeout).await
    }

    /// The leader changes of the election `name`, as a stream: who leads now first, then
    /// each change in term order (a new term, a proclaimed value, no leader), looking
    /// again at every release the store announces and at least every `every`. A slow
    /// consumer may miss leaders in between but always gets to the current one; terms never
    /// go back, also across store outages (a look that fails is retried at the next).
    pub fn observe(&self, name: impl AsRef<str>, every: Duration) -> Result<LeaderChanges> {
        let name = LockKey::new(name)?;
        if every.is_zero() {
            return Err(Error::invalid("an observer's interval is zero"));
        }
        Ok(crate::patterns::election::observe(
            Arc::clone(&self.core),
            name,
            every,
            self.defaults.request_timeout,
        ))
    }

    /// Runs `body` under the lock on `key` (with this client's default options) and
    /// stops it when the lock is lost: [`LockRequest::scoped`] on
    /// [`lock`](Self::lock)`(key)`, which documents the details.
    pub async fn with_lock<F, Fut, T>(&self, key: impl AsRef<str>, body: F) -> Result<T>
    where
        F: FnOnce(LockScope) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(key).scoped(body).await
    }

    /// How many of this client's tasks (and its clones') wait in line for `key` behind
    /// the one whose turn it is.
    ///
    /// The tasks of one client that want the same key wait in a local line, in arrival
    /// order, and only the task at its head talks to the store, so a process with 100
    /// waiting tasks costs the store what one waiting task costs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use std::future::IntoFuture;
    /// use std::time::Duration;
    /// use lock_core::{LockClient, MemoryBackend};
    ///
    /// let client = LockClient::new(MemoryBackend::new());
    /// let holder = client.lock("report").await?;
    /// let waiters: Vec<_> = (0..3)
    ///     .map(|_| tokio::spawn(client.lock("report").wait_up_to(Duration::from_secs(5)).into_future()))
    ///     .collect();
    /// while client.local_waiters("report") < 3 {
    ///     tokio::task::yield_now().await; // the three line up behind the holder, locally
    /// }
    /// holder.release().await?;
    /// for waiter in waiters {
    ///     // Each gets the key in turn, in arrival order.
    ///     waiter.await.expect("task").expect("turn").release().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_waiters(&self, key: impl AsRef<str>) -> usize {
        LockKey::new(key).map_or(0, |key| self.core.local.waiting(&key))
    }

    /// Gives back every lease this client (and its clones) holds, stops their renewal, and
    /// refuses further acquisitions ([`ErrorKind::InvalidInput`]). For the end of a
    /// program: a guard still alive then would otherwise keep a per-key store (SQLite,
    /// Redis, PostgreSQL) locked until its TTL runs out.
    ///
    /// The guards of those leases stay valid: [`LockGuard::is_held`] turns false, a later
    /// [`LockGuard::release`] answers `Ok`, and [`LockGuard::lost`] never fires for them.
    /// `Err` is the first release that did not reach the store (the lease then ends by
    /// its TTL); a lease found lost already is no failure.
    ///
    /// An unfinished [`OnceTicket`](crate::OnceTicket) is the exception: its hold stays in
    /// the store until the ticket is finished or `at_most` ends it, as for a dropped
    /// ticket, because its job may still be running and a released key would let another
    /// replica run it again within the window ("at most once" would no longer hold).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// use lock_core::{LockClient, MemoryBackend};
    ///
    /// let store = MemoryBackend::new();
    /// let client = LockClient::new(store.clone());
    /// let _forgotten = client.lock("nightly").await?;
    /// client.shutdown().await?;
    /// // Free at once for everyone else, although the guard is still alive.
    /// LockClient::new(store).try_lock("nightly").await?.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`LockGuard::is_held`]: crate::LockGuard::is_held
    /// [`LockGuard::release`]: crate::LockGuard::release
    /// [`LockGuard::lost`]: crate::LockGuard::lost
    pub async fn shutdown(&self) -> Result<()> {
        self.core.shutdown().await
    }

    /// A reentrant owner: locks taken through it (and its clones) can be taken again
    /// while held, and are given back to the store only by the outermost release.
    pub fn owner(&self) -> LockOwner {
        LockOwner::new(Arc::clone(&self.core), self.defaults.clone())
    }
}

/// `backend` as a [`DynBackend`]: one already shared is used as it is, not put behind a
/// second `Arc` (every call would then go through two).
fn shared<B: LockBackend>(backend: B) -> DynBackend {
    let backend = Arc::new(backend);
    match (&*backend as &dyn std::any::Any).downcast_ref::<DynBackend>() {
        Some(already) => Arc::clone(already),
        None => backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    #[test]
    fn a_shared_backend_is_used_as_it_is() {
        let backend: DynBackend = Arc::new(MemoryBackend::new());
        let client = LockClient::new(Arc::clone(&backend));
        assert!(Arc::ptr_eq(&client.core.backend, &backend));
    }
}
