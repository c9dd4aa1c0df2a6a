//! What a backend is asked to grant.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::session::Session;
use crate::backend::Grant;
use crate::values::error::{Error, Result};
use crate::values::key::LockKey;
use crate::values::lease::{Lease, LeaseId};
use crate::values::options::Renewal;

/// Everything a backend needs to grant one acquisition.
///
/// Clones are the same acquisition: they share the record of whether any attempt went
/// unanswered, or is still on its way.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    key: LockKey,
    lease_id: LeaseId,
    ttl: Duration,
    /// `ttl` rounded up to the store's step, once the core has prepared the request.
    store_ttl: Option<Duration>,
    drift: Duration,
    renewal: Renewal,
    holder_label: Option<Arc<str>>,
    detached: bool,
    waits: bool,
    unanswered: Arc<AtomicBool>,
    /// Attempts sent whose outcome nobody has heard: a future dropped mid-attempt leaves
    /// its count here, since its request may still reach the store.
    in_flight: Arc<AtomicUsize>,
}

impl AcquireRequest {
    /// A request for `key` with a fresh lease id. `drift` is the clock-drift allowance;
    /// `renewal` says who keeps the grant alive: with [`Renewal::Manual`] it lives for its
    /// TTL unless renewed; with [`Renewal::Auto`] the core's renewal engine keeps it alive,
    /// so a session backend may bind it to a session it shares with the client's other
    /// such leases and keeps alive itself.
    pub fn new(key: LockKey, ttl: Duration, drift: Duration, renewal: Renewal) -> Self {
        AcquireRequest {
            key,
            lease_id: LeaseId::random(),
            ttl,
            store_ttl: None,
            drift,
            renewal,
            holder_label: None,
            detached: false,
            waits: false,
            unanswered: Arc::default(),
            in_flight: Arc::default(),
        }
    }

    /// The same request, labelled for [`LockStatus::holder`](crate::LockStatus::holder).
    pub fn with_holder_label(mut self, label: Option<Arc<str>>) -> Self {
        self.holder_label = label;
        self
    }

    /// The same request for a hold that lives by its TTL alone, judged by the store's
    /// clock: no session keeps it alive or ends it (a client that closes or crashes leaves
    /// it to its TTL), and nothing renews it; its end may be set once with
    /// [`expire_in`](crate::backend::LockBackend::expire_in). A once-per-window ticket's
    /// hold. Sent only to backends whose leases live by their TTL anyway, or with
    /// [`Capabilities::detached_holds`](crate::Capabilities::detached_holds).
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }

    /// The same request from a caller that waits for the key if it is held (not a single
    /// try). A reader-writer lock's writer that waits leaves its intent in the store, so
    /// that new readers queue behind it (see [`LockBackend`](crate::backend::LockBackend)'s
    /// *Shared holds*); a single try leaves nothing.
    pub fn waiting(mut self, waits: bool) -> Self {
        self.waits = waits;
        self
    }

    /// Whether the caller waits for the key if it is held ([`waiting`](Self::waiting)).
    pub fn waits(&self) -> bool {
        self.waits
    }

    /// Whether the hold is to live by its TTL alone ([`detached`](Self::detached)).
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// Who renews the lease once granted.
    pub fn renewal(&self) -> Renewal {
        self.renewal
    }

    /// A label saying who holds the lease (a host name, a job id), for operators; stores
    /// that have room for it keep it.
    pub fn holder_label(&self) -> Option<&str> {
        self.holder_label.as_deref()
    }

    /// Records that an attempt of this acquisition got no usable answer (a time-out, a
    /// lost connection, a grant that arrived already over), so it may still land in the
    /// store later. The core then releases the lease id once more a request timeout after
    /// the lease ends, so such a late landing cannot hold the key for a TTL. A backend that
    /// waits in its own queue calls it for attempts it retries itself.
    pub fn note_unanswered(&self) {
        self.unanswered.store(true, Ordering::Relaxed);
    }

    /// Whether any attempt of this acquisition went unanswered.
    pub fn had_unanswered_attempt(&self) -> bool {
        self.unanswered.load(Ordering::Relaxed)
    }

    /// Runs one attempt of this acquisition, counted as on its way until it returns: if
    /// the caller drops it first, the request may still reach the store.
    pub(crate) async fn attempt<T>(&self, attempt: impl Future<Output = T>) -> T {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let outcome = attempt.await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        outcome
    }

    /// Whether an attempt may still land in the store after now: one went unanswered, or
    /// one was abandoned on its way.
    pub(crate) fn may_land_late(&self) -> bool {
        self.had_unanswered_attempt() || self.in_flight.load(Ordering::Relaxed) > 0
    }

    /// The same request under a chosen lease id (a retry, or a test).
    pub fn with_lease_id(mut self, lease_id: LeaseId) -> Self {
        self.lease_id = lease_id;
        self
    }

    /// The key to lock.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The identity the new lease will have.
    pub fn lease_id(&self) -> LeaseId {
        self.lease_id
    }

    /// The time to live the caller asked for: the lease's local deadline counts from it.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The time to live to ask the store for: [`ttl`](Self::ttl) rounded up to the
    /// store's [`ttl_granularity`](crate::Capabilities::ttl_granularity) by the core
    /// (a request no core call prepared, e.g. in a backend's own test, asks for `ttl`).
    /// Backends use this, and never round themselves.
    pub fn store_ttl(&self) -> Duration {
        self.store_ttl.unwrap_or(self.ttl)
    }

    /// The same request with its store TTL rounded for a store with `capabilities`.
    pub fn for_store(mut self, capabilities: &crate::Capabilities) -> Self {
        self.store_ttl = Some(capabilities.store_ttl(self.ttl));
        self
    }

    /// This request prepared for `capabilities`: itself if it already is.
    pub(crate) fn prepared(
        &self,
        capabilities: &crate::Capabilities,
    ) -> std::borrow::Cow<'_, Self> {
        match self.store_ttl {
            Some(_) => std::borrow::Cow::Borrowed(self),
            None => std::borrow::Cow::Owned(self.clone().for_store(capabilities)),
        }
    }

    /// The clock-drift allowance the granted lease's local deadline will subtract.
    pub fn drift_allowance(&self) -> Duration {
        self.drift
    }

    /// The lease the store granted, for an attempt sent at `sent_at`.
    ///
    /// A lease bound to a session lives by the session: its deadline runs from the send
    /// time of the request that last proved the session alive, for the session's TTL (an
    /// expired session gives a lease that is over at once).
    pub fn grant(&self, grant: impl Into<Grant>, sent_at: Instant) -> Lease {
        let grant = grant.into();
        let sent_at = if crate::defects::active(crate::defects::CoreDefect::LeaseFromReply) {
            crate::values::clock::now()
        } else {
            sent_at
        };
        let lease = Lease::new(
            self.key.clone(),
            self.lease_id,
            grant.token(),
            (self.ttl, self.drift),
            sent_at,
            grant.session().cloned(),
        );
        match grant.session().map(Session::status) {
            None => lease,
            // Over at once: the attempt is retried under a new session.
            Some(status) if status.expired => lease.renewed(Duration::ZERO, sent_at),
            Some(status) => lease.renewed(status.ttl, status.proven_at),
        }
    }

    /// `lease`, if its local deadline is still ahead now that the grant has arrived;
    /// otherwise [`ErrorKind::Unavailable`](crate::ErrorKind), noted on this request as an
    /// unanswered attempt. A grant that is over when it arrives must never be handed out:
    /// the store may already have granted the key to someone else.
    pub fn checked_on_arrival(&self, lease: Lease) -> Result<Lease> {
        if lease.is_valid() {
            return Ok(lease);
        }
        self.note_unanswered();
        Err(Error::new(
            crate::ErrorKind::Unavailable,
            format!(
                "the grant of {:?} arrived after its local deadline ({:?} after it was sent)",
                lease.key().as_str(),
                crate::values::clock::since(lease.sent_at())
            ),
        ))
    }
}
