//! What a backend can promise, declared once per backend.

use std::time::Duration;

use crate::values::error::{Error, Result};

/// How a backend keeps held leases alive. The core runs one renewal engine per client
/// that drives all three, so holding many locks costs a constant number of tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Liveness {
    /// Each lease is renewed by its own request
    /// ([`LockBackend::renew`](crate::backend::LockBackend::renew)).
    #[default]
    PerLease,
    /// The due leases of a client are renewed together in one round trip
    /// ([`LockBackend::renew_many`](crate::backend::LockBackend::renew_many)).
    Batched,
    /// Leases live as long as the store session they were granted under; the backend keeps
    /// each session alive with one keep-alive for all its leases and reports on it
    /// ([`SessionKeeper`](crate::backend::SessionKeeper)). How the contract's TTL maps
    /// onto sessions is each such backend's documented choice.
    Session,
}

/// The guarantees and limits of one backend.
///
/// Declared once in each backend with `..Capabilities::default()` for what it lacks. The
/// core refuses requests outside these limits before the store is touched, and the
/// conformance suite registers a scenario only when the capabilities allow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Waiters are granted the key in the order they started waiting.
    pub fair_ordering: bool,
    /// The store tells waiters when a key is released, so they need not poll.
    pub native_notification: bool,
    /// Fencing tokens survive a restart of the store (the counter is as durable as the
    /// lock itself). Without it, tokens only grow while the store stays up.
    pub durable_fencing: bool,
    /// The core's reentrant [`LockOwner`](crate::LockOwner) may be used with this backend.
    pub reentrancy: bool,
    /// How held leases stay alive, and so how the core's renewal engine drives them.
    pub liveness: Liveness,
    /// The shortest TTL the store can keep.
    pub min_ttl: Duration,
    /// The longest TTL the store can keep.
    pub max_ttl: Duration,
    /// Where [`records`](Self::records) is off by the store's settings, how to turn them
    /// on: said in the error that refuses an idempotent run.
    pub records_hint: Option<&'static str>,
    /// How to allow longer TTLs, where the longest is a setting of the store or of the
    /// URL: said in the error that refuses a TTL above [`max_ttl`](Self::max_ttl).
    pub max_ttl_hint: Option<&'static str>,
    /// The store keeps TTLs rounded up to a multiple of this.
    pub ttl_granularity: Duration,
    /// How much sooner than its TTL a hold can end by the store's clock, counted from the
    /// request that set it: a store that keeps time in whole milliseconds, truncated, can
    /// end one up to 1 ms early. Zero for a store that starts a TTL when the request
    /// arrives and runs it out by a finer clock, however coarse its TTLs (etcd's
    /// whole-second leases). A once-per-window ticket adds it to its bounds.
    pub clock_step: Duration,
    /// The store keeps idempotency records beside its locks, written fenced by the lock
    /// ([`read_record`](crate::backend::LockBackend::read_record),
    /// [`write_record`](crate::backend::LockBackend::write_record)), so
    /// [`LockClient::idempotent`](crate::LockClient::idempotent) works on it.
    pub records: bool,
    /// Where leases are session-bound: the store can also keep a hold that no session
    /// keeps or ends, by its TTL alone, judged by the store's clock (a request marked
    /// [`detached`](crate::backend::AcquireRequest::detached)), and set its end with
    /// [`expire_in`](crate::backend::LockBackend::expire_in). Then
    /// [`LockClient::once`](crate::LockClient::once) works on it too
    /// ([`once_holds`](Self::once_holds)). Meaningless for leases that live by their TTL
    /// anyway.
    pub detached_holds: bool,
    /// The store keeps semaphores and reader-writer locks: keys held in the
    /// [`HoldKind`](crate::HoldKind)s `Permit`, `Read` and `Write`, several leases at once,
    /// by the rules of [`LockBackend`](crate::backend::LockBackend)'s *Shared holds*.
    pub shared_holds: bool,
    /// Where [`shared_holds`](Self::shared_holds) is off, why: said in the error that
    /// refuses a semaphore or a reader-writer lock.
    pub shared_holds_refusal: Option<&'static str>,
    /// The store takes a lock set in one atomic step
    /// ([`try_acquire_all`](crate::backend::LockBackend::try_acquire_all)): all keys or
    /// none, never some of them held while the set waits for the others. Without it the
    /// core takes a set's keys one at a time in canonical order.
    pub atomic_sets: bool,
}

impl Default for Capabilities {
    /// The least a backend may promise: no fairness, no notification, tokens that do not
    /// survive a store restart, TTLs from 1 ms to one day at 1 ms granularity (and a clock
    /// in whole milliseconds), no idempotency records, no semaphores or reader-writer
    /// locks.
    fn default() -> Self {
        Capabilities {
            fair_ordering: false,
            native_notification: false,
            durable_fencing: false,
            reentrancy: true,
            liveness: Liveness::PerLease,
            min_ttl: Duration::from_millis(1),
            max_ttl: Duration::from_secs(24 * 60 * 60),
            max_ttl_hint: None,
            records_hint: None,
            ttl_granularity: Duration::from_millis(1),
            clock_step: Duration::from_millis(1),
            records: false,
            detached_holds: false,
            shared_holds: false,
            shared_holds_refusal: None,
            atomic_sets: false,
        }
    }
}

impl Capabilities {
    /// Whether leases are bound to a store session ([`Liveness::Session`]): they end when
    /// it ends, not only when their TTL runs out.
    pub fn session_bound(&self) -> bool {
        self.liveness == Liveness::Session
    }

    /// Whether the store can keep a hold by its TTL alone, judged by its own clock, as a
    /// once-per-window ticket needs: where leases live by their TTL, or, on a session-bound
    /// store, with [`detached_holds`](Self::detached_holds).
    pub fn once_holds(&self) -> bool {
        !self.session_bound() || self.detached_holds
    }

    /// Refuses a hold of `key` the store cannot keep (a semaphore or a reader-writer lock
    /// on a store without [`shared_holds`](Self::shared_holds)), with
    /// [`ErrorKind::Unsupported`](crate::ErrorKind) naming `backend` and why.
    pub fn check_kind(&self, backend: &str, key: &crate::LockKey) -> Result<()> {
        if key.primitive() == crate::Primitive::Mutex || self.shared_holds {
            return Ok(());
        }
        Err(Error::new(
            crate::ErrorKind::Unsupported,
            format!(
                "{backend} keeps no {}s{}",
                match key.primitive() {
                    crate::Primitive::Semaphore => "semaphore",
                    _ => "reader-writer lock",
                },
                self.shared_holds_refusal
                    .map(|why| format!(": {why}"))
                    .unwrap_or_default()
            ),
        ))
    }

    /// Refuses a TTL the store cannot keep, with [`ErrorKind::InvalidInput`](crate::ErrorKind).
    pub fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl.is_zero() {
            return Err(Error::invalid("TTL is zero"));
        }
        if ttl < self.min_ttl {
            return Err(Error::invalid(format!(
                "TTL {ttl:?} is below this backend's minimum of {:?}",
                self.min_ttl
            )));
        }
        if ttl > self.max_ttl {
            return Err(Error::invalid(format!(
                "TTL {ttl:?} is above this backend's maximum of {:?}{}",
                self.max_ttl,
                self.max_ttl_hint
                    .map(|hint| format!("; to raise it, {hint}"))
                    .unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// `ttl` rounded *up* to the store's granularity, so the store never forgets a lease
    /// before the holder's local deadline.
    pub fn store_ttl(&self, ttl: Duration) -> Duration {
        let step = self.ttl_granularity.as_nanos().max(1);
        let steps = ttl.as_nanos().div_ceil(step);
        let nanos = steps.saturating_mul(step);
        Duration::new(
            u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX),
            // The remainder of a division by 10^9 always fits.
            (nanos % 1_000_000_000) as u32,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_limits() {
        let caps = Capabilities {
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(60),
            ..Capabilities::default()
        };
        assert!(caps.check_ttl(Duration::ZERO).is_err());
        assert!(caps.check_ttl(Duration::from_millis(9)).is_err());
        assert!(caps.check_ttl(Duration::from_secs(61)).is_err());
        assert!(caps.check_ttl(Duration::MAX).is_err());
        assert!(caps.check_ttl(Duration::from_millis(10)).is_ok());
    }

    #[test]
    fn a_too_long_ttl_says_how_to_raise_the_maximum_where_the_backend_can() {
        let fixed = Capabilities::default();
        let message = fixed.check_ttl(Duration::from_secs(200_000)).unwrap_err();
        assert!(!message.to_string().contains("raise"), "{message}");
        let configurable = Capabilities {
            max_ttl_hint: Some("set max_ttl_ms"),
            ..Capabilities::default()
        };
        let message = configurable
            .check_ttl(Duration::from_secs(200_000))
            .unwrap_err()
            .to_string();
        assert!(
            message.ends_with("; to raise it, set max_ttl_ms"),
            "{message}"
        );
    }

    #[test]
    fn store_ttl_rounds_up() {
        let caps = Capabilities {
            ttl_granularity: Duration::from_secs(1),
            ..Capabilities::default()
        };
        assert_eq!(
            caps.store_ttl(Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
        assert_eq!(
            caps.store_ttl(Duration::from_secs(3)),
            Duration::from_secs(3)
        );
    }
}
