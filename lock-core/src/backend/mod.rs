//! What a backend crate implements, and the pieces of the core it builds with.
//!
//! Users never need this module: they hold a [`LockClient`](crate::LockClient). A backend
//! implements [`LockBackend`] (the store's few atomic operations), declares its
//! [`Capabilities`] once, and reuses what is here for what every store needs: request
//! time-outs ([`with_timeout`]), release notifications ([`ReleaseFeed`]) fed by a
//! supervised listener ([`supervise_listener`]), pooled sessions kept alive on one cadence
//! ([`SessionPool`] over a store's [`SessionStore`] calls, reporting to a
//! [`SessionKeeper`]), retries ([`Backoff::retry_until`](crate::Backoff::retry_until),
//! [`Restarts`], [`supervise`]), requests that must finish once sent
//! ([`finish_if_dropped`]) and a poison-tolerant mutex ([`lock_unpoisoned`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod detach;
mod feed;
mod listener;
mod record;
mod request;
mod retry;
mod support;

pub(crate) mod capabilities;
pub(crate) mod session;
mod session_pool;
mod store;
mod store_url;
pub(crate) mod sync;

pub use crate::patterns::DEFAULT_RETENTION;
pub use crate::values::clock::now;
pub use crate::values::default_drift_allowance;
/// Re-exported so backend crates implement [`LockBackend`] with the same macro version.
pub use async_trait::async_trait;
pub use capabilities::{Capabilities, Liveness};
pub use detach::{finish_if_dropped, FinishIfDropped};
pub use feed::ReleaseFeed;
pub use listener::{supervise_listener, ListenerLink, ListenerTask};
pub use record::{Record, MAX_RETENTION};
pub use request::AcquireRequest;
pub use retry::{supervise, unanswered, Progress, Restarts};
pub use session::{Session, SessionKeeper, SessionStatus};
pub use session_pool::{PooledSession, SessionKind, SessionNews, SessionPool, SessionStore};
pub use store::{require_runtime, Connecting, Store};
pub use store_url::{redact_url, redact_url_in, StoreHost, StoreUrl};
pub use support::with_timeout;
use support::within;
pub use sync::lock_unpoisoned;

use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::{HoldKind, LockKey};
use crate::values::lease::{FencingToken, Lease, LeaseId};

/// A shareable, type-erased backend: what the client layer and the conformance suite hold.
pub type DynBackend = Arc<dyn LockBackend>;

/// Who holds a key right now, as the store sees it. For the core and backend tests: the
/// lease id is the right to release, so users see a [`LockStatus`](crate::LockStatus)
/// without it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's lease id.
    pub lease_id: LeaseId,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// Time left before the store expires the lease, by the store's clock.
    pub remaining_ttl: Duration,
    /// How many acquisitions queue for the key, where the store keeps a queue (fair
    /// backends must report it); `None` when it does not know.
    pub waiters: Option<usize>,
    /// The holder's label ([`AcquireRequest::holder_label`]), where the store keeps it.
    pub holder: Option<String>,
    /// How the holder holds the key: [`HoldKind::Mutex`] for a mutex; a permit, a read or
    /// a write for the other primitives.
    pub kind: HoldKind,
}

/// How a release ended, from the releasing lease's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was live and is now released.
    Released,
    /// The lease was not held, and it cannot have expired yet: an earlier attempt (whose
    /// reply may have been lost) released it already. Nobody else's lock was touched.
    AlreadyReleased,
}

/// What the store found when it applied an operation conditional on one lease
/// ([`renew`](LockBackend::renew), [`expire_in`](LockBackend::expire_in),
/// [`release`](LockBackend::release), [`write_record`](LockBackend::write_record)).
///
/// `NotHeld` is not an error of the store but news the caller must act on (the lease is
/// lost, or was already released), hence a type the compiler makes it look at.
#[must_use = "NotHeld means the lease is gone and the operation changed nothing"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The lease was live, and the operation took effect (renewed, shortened, released,
    /// recorded).
    Held,
    /// The lease was not live (never held, released, expired or replaced): nothing was
    /// changed.
    NotHeld,
}

impl Ownership {
    /// `Held` when the store's conditional step `took_effect` (a row updated, a script
    /// answering 1), `NotHeld` otherwise: for backends reading a store's raw answer.
    pub fn held_if(took_effect: bool) -> Self {
        if took_effect {
            Ownership::Held
        } else {
            Ownership::NotHeld
        }
    }

    /// Whether the lease was live and the operation took effect.
    pub fn is_held(self) -> bool {
        self == Ownership::Held
    }
}

/// What a store answers to a successful acquisition attempt.
#[derive(Clone, Debug)]
pub struct Grant {
    token: FencingToken,
    session: Option<Session>,
}

impl Grant {
    /// A grant that lives by its own TTL (and renewals of it).
    pub fn new(token: FencingToken) -> Self {
        Grant {
            token,
            session: None,
        }
    }

    /// A grant that lives as long as `session` ([`Liveness::Session`]): its local deadline
    /// is the session's, and moves with the session's keep-alives.
    pub fn in_session(token: FencingToken, session: Session) -> Self {
        Grant {
            token,
            session: Some(session),
        }
    }

    /// The fencing token of the new ownership.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The session the lease is bound to, if any.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }
}

impl From<FencingToken> for Grant {
    fn from(token: FencingToken) -> Self {
        Grant::new(token)
    }
}

/// A queued waiter's look at its turn ([`LockBackend::try_acquire_queued`]).
#[derive(Debug)]
pub enum Turn {
    /// The waiter was at the head of the queue, its own entry (and session) still alive,
    /// and the key was free: it holds the key now.
    Granted(Grant),
    /// Others are ahead, or the key is still held.
    Waiting,
    /// The waiter's entry is gone (it expired or was removed): it must enqueue again.
    NotQueued,
}

/// One lease to renew in a [`LockBackend::renew_many`] call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// The locked key.
    pub key: LockKey,
    /// The lease to extend.
    pub lease_id: LeaseId,
    /// The TTL to extend it to, from now.
    pub ttl: Duration,
}

/// Why a [`KeyWatch`] woke its waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The store announced a release of the key.
    Released,
    /// Releases may have gone unheard (the backend's listener was down, or has just
    /// subscribed again): look again. Not a release that someone else won, so the waiter
    /// does not treat a failed attempt after it as contention.
    LookAgain,
}

/// Notifications that a key may have become free. Spurious wake-ups are allowed; missed
/// ones are covered by the waiter's fallback poll.
#[async_trait]
pub trait KeyWatch: Send {
    /// Resolves when the key may have changed since the watch began or since the last
    /// call, saying why.
    async fn changed(&mut self) -> Result<Change>;
}

/// The primitive operations of one store; the only trait a backend crate implements.
///
/// Every mutating operation is conditional on the lease id and idempotent under retry.
/// Waiting, renewal, reentrancy, lost-lock signalling, cancellation clean-up and tracing
/// live in the core on top of these operations.
///
/// Which optional groups a backend implements follows from its [`Capabilities`]:
/// - [`Liveness::PerLease`]: [`renew`](Self::renew) (the core renews each lease with it).
/// - [`Liveness::Batched`]: [`renew_many`](Self::renew_many) in one round trip.
/// - [`Liveness::Session`]: grants carry a [`Session`] ([`Grant::in_session`]) that the
///   backend keeps alive and reports on; [`renew`](Self::renew) proves one lease and its
///   session alive on demand (manual renewal).
/// - [`fair_ordering`](Capabilities::fair_ordering): the queue operations
///   ([`enqueue`](Self::enqueue), [`try_acquire_queued`](Self::try_acquire_queued),
///   [`leave_queue`](Self::leave_queue), [`watch_turn`](Self::watch_turn)).
/// - [`shared_holds`](Capabilities::shared_holds): the rules below, and
///   [`holders`](Self::holders).
///
/// # Shared holds: semaphores and reader-writer locks
///
/// Every key says how it is held ([`LockKey::kind`]). The core sends a backend keys of
/// other kinds than [`HoldKind::Mutex`] only when it declares
/// [`shared_holds`](Capabilities::shared_holds), and never to the record, detached-hold or
/// [`list_held`](Self::list_held) operations. Each [`Primitive`](crate::Primitive) has a
/// namespace of its own: the mutex `k`, the semaphore `k` and the reader-writer lock `k`
/// are three keys that never contend. A semaphore or reader-writer key may be held by
/// several leases at once, each an entry of its own (lease id, kind, token, expiry or
/// session, label), found by `(key, lease id)` as a mutex's lease is.
///
/// - **Grant rules** ([`try_acquire`](Self::try_acquire), and
///   [`try_acquire_queued`](Self::try_acquire_queued) on a fair backend):
///   - `Permit { limit }`: granted while fewer than `limit` live leases hold the
///     semaphore. A live holder (or a queued waiter) that asked with another limit makes
///     the request [`ErrorKind::InvalidInput`], naming both limits; the limit is the
///     semaphore's for as long as anyone holds or waits for it, so it changes once the
///     semaphore is empty.
///   - `Read`: granted while no live lease holds the write lock and no writer waits.
///   - `Write`: granted while no live lease holds the key at all (read or write).
///   - A retry by a lease id that already holds the key answers its grant again, as for
///     the mutex: same token, TTL restarted.
/// - **Waiting writers** (writer preference): on a backend without
///   [`fair_ordering`](Capabilities::fair_ordering), a `Write` request that
///   [`waits`](AcquireRequest::waits) and is refused leaves an intent for its lease id that
///   lives for its TTL from the attempt (each attempt renews it), or as long as its
///   session; a live intent of another lease makes `Read` requests wait. The grant of that
///   lease, its [`release`](Self::release) (answering [`Ownership::NotHeld`] when only the
///   intent was there) and the intent's expiry remove it. A single try leaves none. On a
///   fair backend the queue does this: a reader is granted when no writer holds the key
///   and none is queued ahead of it; a writer when it is first in the queue and nobody
///   holds the key; a permit when fewer than `limit` leases hold or queue ahead of it.
/// - **Tokens**: every grant's token is greater than every token granted before for the
///   key in its primitive (every permit of a semaphore; every read and write of a
///   reader-writer lock).
/// - [`renew`](Self::renew), [`renew_many`](Self::renew_many),
///   [`expire_in`](Self::expire_in) and [`release`](Self::release) act on the one entry of
///   `(key, lease id)`, leaving the key's other holders alone. [`watch`](Self::watch)
///   wakes for the release of any of the key's holders.
/// - [`inspect`](Self::inspect) answers one holder (the oldest), [`holders`](Self::holders)
///   every live one; [`stored_keys`](Self::stored_keys) lists shared keys too (holders,
///   intents, queue entries), and nothing once every holder and waiter is gone.
#[async_trait]
pub trait LockBackend: fmt::Debug + Send + Sync + 'static {
    /// A short name for logs and reports (`"memory"`, `"redis"`, `"postgres"`, ...).
    fn name(&self) -> &'static str;

    /// What this backend guarantees; the same value for the life of the backend.
    fn capabilities(&self) -> &Capabilities;

    /// One atomic attempt: grants the key to `request.lease_id()` when it is free, when
    /// its lease expired, or when it is already held by that same lease id (a retry whose
    /// reply was lost: the same token is returned and the TTL starts again). Returns
    /// `Ok(None)` when a different live lease holds the key. A new grant's token is
    /// greater than every token issued before for the key. On a fair backend it never
    /// jumps the queue: while anyone queues for the key it grants nothing.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>>;

    /// Backends with [`atomic_sets`](Capabilities::atomic_sets): grants every request
    /// (mutex keys, each as [`try_acquire`](Self::try_acquire) would grant it alone, a
    /// retry of the same lease ids included) in one atomic step, or none of them: `Ok(None)`
    /// when another live lease holds any of the keys, changing nothing. Grants come in the
    /// order of `requests`.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<Option<Vec<Grant>>> {
        let _ = requests;
        Err(Error::new(
            ErrorKind::Unsupported,
            format!("{} cannot take a set of keys in one step", self.name()),
        ))
    }

    /// Extends the live lease `lease_id` on `key` to `ttl` from now. Answers
    /// [`Ownership::NotHeld`] when that lease is not live in the store (expired, released
    /// or replaced): the lease is lost, and nothing is changed. On a session backend, proves the lease's entry and
    /// its session alive (refreshing the session).
    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership>;

    /// Sets the live lease `lease_id` on `key` to end exactly `ttl` from now, sooner or
    /// later than it would have: for a hold that must end at a given time (a
    /// once-per-window ticket finished early). Answers [`Ownership::NotHeld`] when that lease
    /// is not live.
    /// The default is [`renew`](Self::renew), right for a backend whose renewal sets the
    /// expiry exactly; a backend whose renewal never shortens a lease overrides it. On a
    /// session-bound backend it is only asked of a
    /// [detached](crate::backend::AcquireRequest::detached) hold (a session's hold cannot
    /// be shortened).
    async fn expire_in(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl: Duration,
    ) -> Result<Ownership> {
        self.renew(key, lease_id, ttl).await
    }

    /// Renews many leases, answering for each in order as [`renew`](Self::renew) would.
    /// The default sends one [`renew`](Self::renew) per lease, a bounded number at a
    /// time; a [`Liveness::Batched`] backend overrides it with one round trip.
    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        use futures_util::StreamExt;
        let renewals: Vec<_> = leases
            .iter()
            .map(|lease| self.renew(&lease.key, lease.lease_id, lease.ttl))
            .collect();
        futures_util::stream::iter(renewals)
            .buffered(64)
            .collect()
            .await
    }

    /// Removes the lease `lease_id` on `key` if it is live. Answers [`Ownership::NotHeld`]
    /// when it was not live (never held, already released, expired, or replaced by another lease), in
    /// which case nothing else is touched. A backend that keeps expired entries may delete
    /// its own expired entry.
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership>;

    /// Who holds `key`, or `None` if it is free (expired leases count as free).
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>>;

    /// Every live lease holding `key`, oldest grant first: one at most for a mutex, up to
    /// the limit for a semaphore, every reader (or the one writer) of a reader-writer lock.
    /// The default answers [`inspect`](Self::inspect)'s holder, right for a backend
    /// without [`shared_holds`](Capabilities::shared_holds).
    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        Ok(self.inspect(key).await?.into_iter().collect())
    }

    /// Every live lease whose key starts with `prefix`, at most `limit` of them, in key
    /// order: for operators looking for a stuck key. The default refuses with
    /// [`ErrorKind::Unsupported`].
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let _ = (prefix, limit);
        Err(Error::new(
            ErrorKind::Unsupported,
            format!("{} cannot list its held keys", self.name()),
        ))
    }

    /// Every key starting with `prefix` that the store still keeps anything for: held or
    /// expired leases not cleaned up yet, queued waiters, their session entries; not what
    /// the backend's docs say it keeps for ever (such as a fencing counter). Sorted, each
    /// key once. For operators looking for what crashed clients left behind, and for the
    /// conformance suite, which checks that nothing is. The default refuses with
    /// [`ErrorKind::Unsupported`].
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let _ = prefix;
        Err(Error::new(
            ErrorKind::Unsupported,
            format!("{} cannot list its stored keys", self.name()),
        ))
    }

    /// Subscribes to changes of `key`. `Ok(None)` (the default) means the backend has no
    /// native notification and waiters poll.
    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        let _ = key;
        Ok(None)
    }

    /// Fair backends: puts `request` in the key's queue behind everyone already there.
    ///
    /// Idempotent per lease id: the core retries an unanswered enqueue with the same
    /// request, which must find its entry and keep its place, never add a second one.
    /// The entry dies with its waiter: the core removes it with
    /// [`leave_queue`](Self::leave_queue) when the wait ends without a grant, and a waiter
    /// that crashed must not block the queue for longer than its TTL (or session).
    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        let _ = request;
        Err(no_queue(self.name()))
    }

    /// Fair backends: grants the key to the queued `request` if it is first in the queue
    /// and the key is free. Before granting it re-checks that the waiter's own entry, and
    /// its lease or session, are still alive (a grant to a dead waiter would be held by
    /// nobody). Keeps a live waiter's entry alive. The grant is idempotent like
    /// [`try_acquire`](Self::try_acquire)'s.
    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        let _ = request;
        Err(no_queue(self.name()))
    }

    /// Fair backends: removes `lease_id`'s entry from the key's queue, if it is there.
    /// Idempotent; never touches a granted lease (release does that).
    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        let _ = (key, lease_id);
        Err(no_queue(self.name()))
    }

    /// Fair backends: resolves when the queued `request` may have reached the head (its
    /// predecessor left), so waiters do not all wake for every change. The default
    /// watches the whole key.
    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        self.watch(request.key()).await
    }

    /// Backends with [`records`](Capabilities::records): the result record of a completed
    /// idempotent run of `key`, or `None` when there is none (never written, or past its
    /// retention). Records live beside the locks but never collide with them.
    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        let _ = key;
        Err(no_records(self.name()))
    }

    /// Backends with [`records`](Capabilities::records): stores `record` for `key` for
    /// `retention`, **fenced**: in one atomic step on the store, only while `lease_id`
    /// holds `key`'s lock (a live, unexpired lease). Answers [`Ownership::NotHeld`],
    /// writing nothing, when it does not: a holder that lost its lock cannot record over the next
    /// holder's result. Idempotent: writing the same record again succeeds.
    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        let _ = (key, lease_id, record, retention);
        Err(no_records(self.name()))
    }
}

pub(crate) fn no_records(backend: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("{backend} keeps no idempotency records"),
    )
}

pub(crate) fn no_queue(backend: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("backend {backend} keeps no fair queue"),
    )
}

/// Single operations with the contract's bookkeeping applied: TTL checks, send-time
/// measurement, a request timeout, lost/already-released classification.
/// Implemented for every backend; the core and the conformance suite use it.
pub trait LockBackendExt: LockBackend {
    /// One acquisition attempt. A held key is [`ErrorKind::HeldByAnother`].
    ///
    /// A grant whose reply arrives after the lease's local deadline is never returned:
    /// the store may already have given the key to someone else, so it counts as an
    /// unanswered attempt ([`ErrorKind::Unavailable`]) and a retry with the same lease id
    /// renews it or finds it gone.
    fn acquire_once(
        &self,
        request: &AcquireRequest,
        timeout: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// One attempt at a whole set ([`LockBackend::try_acquire_all`]), with the same
    /// bookkeeping as [`acquire_once`](Self::acquire_once) for every key: a held key is
    /// [`ErrorKind::HeldByAnother`]; a grant of any key arriving after its local deadline
    /// makes the attempt unanswered.
    fn acquire_all_once(
        &self,
        requests: &[AcquireRequest],
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<Lease>>> + Send;

    /// A queued waiter's attempt ([`LockBackend::try_acquire_queued`]), with the same
    /// bookkeeping as [`acquire_once`](Self::acquire_once).
    fn acquire_queued_once(
        &self,
        request: &AcquireRequest,
        timeout: Duration,
    ) -> impl Future<Output = Result<QueuedAttempt>> + Send;

    /// Renews `lease` for `ttl`. A lease that is not live any more is [`ErrorKind::Lost`].
    fn renew_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Releases `lease`. When the store does not hold it, the outcome depends on the local
    /// deadline: before it, an earlier attempt released it
    /// ([`ReleaseOutcome::AlreadyReleased`]); after it, it may have expired
    /// ([`ErrorKind::Lost`]). Another holder's lock is never touched.
    fn release_lease(
        &self,
        lease: &Lease,
        timeout: Duration,
    ) -> impl Future<Output = Result<ReleaseOutcome>> + Send;
}

// Not boxed (unlike the implementor trait): these run on every lock and release.
impl<B: LockBackend + ?Sized> LockBackendExt for B {
    async fn acquire_once(&self, request: &AcquireRequest, timeout: Duration) -> Result<Lease> {
        self.capabilities().check_ttl(request.ttl())?;
        let request = &*request.prepared(self.capabilities());
        let sent_at = crate::values::clock::now();
        let reply = request
            .attempt(within(
                self.name(),
                sent_at,
                timeout,
                "acquire",
                self.try_acquire(request),
            ))
            .await;
        match answered(request, reply)? {
            Some(grant) => request.checked_on_arrival(request.grant(grant, sent_at)),
            None => Err(held_by_another(request.key())),
        }
    }

    async fn acquire_all_once(
        &self,
        requests: &[AcquireRequest],
        timeout: Duration,
    ) -> Result<Vec<Lease>> {
        let Some(first) = requests.first() else {
            return Ok(Vec::new());
        };
        let prepared: Vec<AcquireRequest> = requests
            .iter()
            .map(|request| {
                self.capabilities().check_ttl(request.ttl())?;
                Ok(request.prepared(self.capabilities()).into_owned())
            })
            .collect::<Result<_>>()?;
        let sent_at = crate::values::clock::now();
        // Counted on the first request for the whole set: they travel together.
        let reply = first
            .attempt(within(
                self.name(),
                sent_at,
                timeout,
                "acquire",
                self.try_acquire_all(&prepared),
            ))
            .await;
        if reply
            .as_ref()
            .is_err_and(|err| err.kind() == ErrorKind::Unavailable)
        {
            requests.iter().for_each(AcquireRequest::note_unanswered);
        }
        let Some(grants) = reply? else {
            return Err(Error::new(
                ErrorKind::HeldByAnother,
                format!(
                    "a key of the set {:?}",
                    requests
                        .iter()
                        .map(|r| r.key().as_str())
                        .collect::<Vec<_>>()
                ),
            ));
        };
        let leases: Vec<Lease> = requests
            .iter()
            .zip(grants)
            .map(|(request, grant)| request.grant(grant, sent_at))
            .collect();
        if leases.len() != requests.len() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "{} granted a set of {} keys {} grants",
                    self.name(),
                    requests.len(),
                    leases.len()
                ),
            ));
        }
        requests
            .iter()
            .zip(leases)
            .map(|(request, lease)| request.checked_on_arrival(lease))
            .collect()
    }

    async fn acquire_queued_once(
        &self,
        request: &AcquireRequest,
        timeout: Duration,
    ) -> Result<QueuedAttempt> {
        let request = &*request.prepared(self.capabilities());
        let sent_at = crate::values::clock::now();
        let turn = request
            .attempt(within(
                self.name(),
                sent_at,
                timeout,
                "acquire",
                self.try_acquire_queued(request),
            ))
            .await;
        Ok(match answered(request, turn)? {
            Turn::Granted(grant) => {
                QueuedAttempt::Granted(request.checked_on_arrival(request.grant(grant, sent_at))?)
            }
            Turn::Waiting => QueuedAttempt::Waiting,
            Turn::NotQueued => QueuedAttempt::NotQueued,
        })
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.capabilities().check_ttl(ttl)?;
        let sent_at = crate::values::clock::now();
        let renewed = self.renew(lease.key(), lease.id(), self.capabilities().store_ttl(ttl));
        match within(self.name(), sent_at, timeout, "renew", renewed).await? {
            Ownership::Held => Ok(lease.renewed(ttl, sent_at)),
            Ownership::NotHeld => Err(Error::lost(format!(
                "lease on {:?} is no longer held",
                lease.key().as_str()
            ))),
        }
    }

    async fn release_lease(&self, lease: &Lease, timeout: Duration) -> Result<ReleaseOutcome> {
        let released = self.release(lease.key(), lease.id());
        match within(
            self.name(),
            crate::values::clock::now(),
            timeout,
            "release",
            released,
        )
        .await?
        {
            Ownership::Held => Ok(ReleaseOutcome::Released),
            Ownership::NotHeld => not_held_outcome(lease),
        }
    }
}

/// What the store's "this lease is not held" means for `lease`: before the local deadline
/// the store cannot have expired it, so an earlier attempt of ours released it
/// ([`ReleaseOutcome::AlreadyReleased`]); after the deadline it may have expired, which is
/// reported as [`ErrorKind::Lost`].
fn not_held_outcome(lease: &Lease) -> Result<ReleaseOutcome> {
    if lease.is_valid() {
        Ok(ReleaseOutcome::AlreadyReleased)
    } else {
        Err(Error::lost(format!(
            "lease on {:?} expired before it was released",
            lease.key().as_str()
        )))
    }
}

/// What one queued attempt came to ([`LockBackendExt::acquire_queued_once`]).
#[derive(Debug)]
pub enum QueuedAttempt {
    /// The waiter holds the key.
    Granted(Lease),
    /// Still waiting for its turn.
    Waiting,
    /// Its queue entry is gone; it must enqueue again.
    NotQueued,
}

/// Notes an unanswered attempt on the request before passing the result on.
fn answered<T>(request: &AcquireRequest, result: Result<T>) -> Result<T> {
    if let Err(err) = &result {
        if err.kind() == ErrorKind::Unavailable {
            request.note_unanswered();
        }
    }
    result
}

/// The kind already says "held by another": the message only names the key, so the line
/// reads `held by another: "k"`.
pub(crate) fn held_by_another(key: &LockKey) -> Error {
    Error::new(ErrorKind::HeldByAnother, format!("{:?}", key.as_str()))
}

macro_rules! forward_backend {
    ($ty:ty) => {
        #[async_trait]
        impl<B: LockBackend + ?Sized> LockBackend for $ty {
            fn name(&self) -> &'static str {
                (**self).name()
            }
            fn capabilities(&self) -> &Capabilities {
                (**self).capabilities()
            }
            async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
                (**self).try_acquire(request).await
            }
            async fn try_acquire_all(
                &self,
                requests: &[AcquireRequest],
            ) -> Result<Option<Vec<Grant>>> {
                (**self).try_acquire_all(requests).await
            }
            async fn renew(
                &self,
                key: &LockKey,
                lease_id: LeaseId,
                ttl: Duration,
            ) -> Result<Ownership> {
                (**self).renew(key, lease_id, ttl).await
            }
            async fn expire_in(
                &self,
                key: &LockKey,
                lease_id: LeaseId,
                ttl: Duration,
            ) -> Result<Ownership> {
                (**self).expire_in(key, lease_id, ttl).await
            }
            async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
                (**self).renew_many(leases).await
            }
            async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
                (**self).release(key, lease_id).await
            }
            async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
                (**self).inspect(key).await
            }
            async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
                (**self).holders(key).await
            }
            async fn list_held(
                &self,
                prefix: &str,
                limit: usize,
            ) -> Result<Vec<(LockKey, HolderInfo)>> {
                (**self).list_held(prefix, limit).await
            }
            async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
                (**self).stored_keys(prefix).await
            }
            async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
                (**self).watch(key).await
            }
            async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
                (**self).enqueue(request).await
            }
            async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
                (**self).try_acquire_queued(request).await
            }
            async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
                (**self).leave_queue(key, lease_id).await
            }
            async fn watch_turn(
                &self,
                request: &AcquireRequest,
            ) -> Result<Option<Box<dyn KeyWatch>>> {
                (**self).watch_turn(request).await
            }
            async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
                (**self).read_record(key).await
            }
            async fn write_record(
                &self,
                key: &LockKey,
                lease_id: LeaseId,
                record: &Record,
                retention: Duration,
            ) -> Result<Ownership> {
                (**self)
                    .write_record(key, lease_id, record, retention)
                    .await
            }
        }
    };
}

forward_backend!(Arc<B>);
forward_backend!(Box<B>);
