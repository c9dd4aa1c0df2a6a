//! Leases, lease ids and fencing tokens.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::backend::session::{Session, SessionStatus};
use crate::values::error::{Error, Result};
use crate::values::key::LockKey;

/// A random 128-bit identity of one acquisition, chosen by the client before it sends the
/// request so that a retried request can be recognised by the store as the same one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u128);

impl LeaseId {
    /// A fresh id from the operating system's random source.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        // A lease id needs uniqueness, not secrecy: if the OS source is unavailable, fall
        // back to the process-seeded generator rather than failing the acquisition.
        if getrandom::fill(&mut bytes).is_err() {
            bytes = fastrand::u128(..).to_le_bytes();
        }
        LeaseId(u128::from_le_bytes(bytes))
    }

    /// The id as a number (for stores that keep it in binary form).
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Rebuilds an id read back from a store.
    pub fn from_u128(id: u128) -> Self {
        LeaseId(id)
    }
}

impl fmt::Display for LeaseId {
    /// 32 lowercase hex digits, the form stores keep as text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

impl FromStr for LeaseId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.len() != 32 {
            return Err(Error::invalid(format!(
                "lease id {s:?} is not 32 hex digits"
            )));
        }
        u128::from_str_radix(s, 16)
            .map(LeaseId)
            .map_err(|_| Error::invalid(format!("lease id {s:?} is not 32 hex digits")))
    }
}

/// A number that grows with every new ownership of a key.
///
/// Every acquisition that is not a re-entry gets a token strictly greater than every token
/// issued before for the same key, so a resource that remembers the highest token it has
/// seen can refuse a stale holder (see [`FencedResource`](crate::FencedResource)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a token read from a store.
    pub const fn new(token: u64) -> Self {
        FencingToken(token)
    }

    /// The token as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One successful acquisition of a key.
///
/// Its validity is judged on the local monotonic clock from the moment the request that
/// granted or last renewed it was *sent*, minus a clock-drift allowance, so the holder
/// stops trusting the lease before the store can hand the key to anyone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    key: LockKey,
    id: LeaseId,
    token: FencingToken,
    ttl: Duration,
    drift: Duration,
    sent_at: Instant,
    valid_until: Instant,
    session: Option<Session>,
}

impl Lease {
    /// A lease granted to `id` with `token`, valid for `ttl` minus `drift` from `sent_at`.
    pub(crate) fn new(
        key: LockKey,
        id: LeaseId,
        token: FencingToken,
        (ttl, drift): (Duration, Duration),
        sent_at: Instant,
        session: Option<Session>,
    ) -> Lease {
        Lease {
            key,
            id,
            token,
            ttl,
            drift,
            sent_at,
            valid_until: local_deadline(sent_at, ttl, drift),
            session,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The identity of this acquisition.
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// The fencing token of this ownership.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The time to live the store was asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The clock-drift allowance subtracted from the TTL for the local deadline.
    pub fn drift_allowance(&self) -> Duration {
        self.drift
    }

    /// When the request that granted or last renewed the lease was sent.
    pub fn sent_at(&self) -> Instant {
        self.sent_at
    }

    /// The local deadline: after this instant the holder must assume the lease is gone.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Time left before [`valid_until`](Self::valid_until), zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until
            .saturating_duration_since(crate::values::clock::now())
    }

    /// Whether the local deadline is still ahead.
    pub fn is_valid(&self) -> bool {
        crate::values::clock::now() < self.valid_until
    }

    /// The store session the lease lives by, on a session-bound backend.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// The same lease with its deadline moved by what its session's status proves; `None`
    /// when the status proves nothing newer than the lease already knows. An expired
    /// session proves nothing: the lease is gone.
    pub(crate) fn proven_by(&self, status: &SessionStatus) -> Option<Lease> {
        (!status.expired && status.proven_at > self.sent_at)
            .then(|| self.renewed(status.ttl, status.proven_at))
    }

    /// The same lease, extended by a renewal with `ttl` sent at `sent_at`.
    ///
    /// Backends call this after the store confirmed the renewal.
    pub fn renewed(&self, ttl: Duration, sent_at: Instant) -> Lease {
        Lease {
            ttl,
            sent_at,
            valid_until: local_deadline(sent_at, ttl, self.drift),
            ..self.clone()
        }
    }
}

fn local_deadline(sent_at: Instant, ttl: Duration, drift: Duration) -> Instant {
    // TTLs are validated against the backend's maximum before any lease exists, so the
    // addition cannot overflow in practice; saturate anyway rather than panic.
    let valid_for = ttl.saturating_sub(drift);
    sent_at.checked_add(valid_for).unwrap_or(sent_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_id_round_trips_through_text() {
        let id = LeaseId::random();
        assert_eq!(id.to_string().parse::<LeaseId>().unwrap(), id);
        assert_ne!(LeaseId::random(), LeaseId::random());
        assert!("xyz".parse::<LeaseId>().is_err());
    }

    #[test]
    fn deadline_is_measured_from_send_minus_drift() {
        let sent = crate::values::clock::now();
        let lease = Lease::new(
            LockKey::new("k").unwrap(),
            LeaseId::random(),
            FencingToken::new(7),
            (Duration::from_secs(10), Duration::from_millis(102)),
            sent,
            None,
        );
        assert_eq!(lease.valid_until(), sent + Duration::from_millis(9898));
        let later = sent + Duration::from_secs(1);
        assert_eq!(
            lease.renewed(Duration::from_secs(10), later).valid_until(),
            later + Duration::from_millis(9898)
        );
        assert_eq!(
            lease.renewed(Duration::from_secs(10), later).token(),
            FencingToken::new(7)
        );
    }
}
