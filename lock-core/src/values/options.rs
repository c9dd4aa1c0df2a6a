//! How to acquire: TTL, waiting, renewal, backoff.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an acquisition may wait for a key held by someone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Try once; fail with [`ErrorKind::HeldByAnother`](crate::ErrorKind) if held.
    No,
    /// Wait up to this long; then fail with [`ErrorKind::TimedOut`](crate::ErrorKind).
    UpTo(Duration),
    /// Wait until the key is free, retrying through store outages as well (each request
    /// is still bounded by the request timeout).
    Forever,
}

impl Wait {
    /// The instant the wait ends, measured from `start`; `None` for ever.
    pub fn deadline_from(self, start: Instant) -> Option<Instant> {
        match self {
            Wait::No => Some(start),
            // A bound too large to represent is as good as for ever.
            Wait::UpTo(bound) => start.checked_add(bound),
            Wait::Forever => None,
        }
    }

    /// What is left of this wait after it began at `start`.
    pub(crate) fn remaining_from(self, start: Instant) -> Wait {
        match self {
            Wait::UpTo(bound) => {
                Wait::UpTo(bound.saturating_sub(crate::values::clock::since(start)))
            }
            other => other,
        }
    }
}

/// Who keeps a held lease alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The client's renewal engine keeps the lease alive (renewing at a third of the TTL,
    /// or following its session) until the guard is released or dropped.
    Auto,
    /// The holder calls [`LockGuard::renew`](crate::LockGuard::renew) itself.
    Manual,
}

/// Exponential backoff with full jitter between attempts while waiting: the n-th pause is
/// uniformly random in `[0, min(max, initial * 2^n)]`, which spreads contenders apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The cap of the first pause.
    pub initial: Duration,
    /// The cap of every pause; with native notification, the fallback poll interval.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    /// The pause before attempt number `attempt` (0-based).
    pub fn pause(&self, attempt: u32) -> Duration {
        let cap = self
            .initial
            .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX))
            .min(self.max);
        cap.mul_f64(fastrand::f64())
    }
}

/// Whether a held lease may pass between tasks of one client without a store round trip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseSharing {
    /// Each task's ownership is its own, with its own fencing token: a release goes to the
    /// store, and the next task acquires the key anew.
    #[default]
    OwnLease,
    /// Opt-in: when this lock is released while another task of the same client waits for
    /// the key (and shares too), the held lease is handed to that task without a store
    /// round trip. Faster handovers, at a price: both tasks then work under **one**
    /// ownership with **one fencing token**, so a resource fenced by the token cannot tell
    /// their writes apart, and the store sees one uninterrupted hold by the process.
    SharedWithLocalWaiters,
}

/// Everything about one acquisition except the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireOptions {
    /// How long the store keeps the lease without renewal. Default 30 s.
    pub ttl: Duration,
    /// How long to wait for a held key. Default: for ever.
    pub wait: Wait,
    /// Who renews. Default: automatic.
    pub renewal: Renewal,
    /// Subtracted from the TTL for the holder's local deadline. Default: 1% of the TTL
    /// plus 2 ms.
    pub clock_drift: Option<Duration>,
    /// Pauses between attempts while waiting.
    pub backoff: Backoff,
    /// The longest one store request may take before it counts as unanswered
    /// ([`ErrorKind::Unavailable`](crate::ErrorKind)). Default 5 s.
    pub request_timeout: Duration,
    /// Who holds the lock, for operators ([`LockStatus::holder`](crate::LockStatus)):
    /// a host name, a job id. Kept by the stores that have room for it. Default: none.
    pub holder_label: Option<Arc<str>>,
    /// Whether the lease may pass to another task of this client without the store.
    /// Default: [`LeaseSharing::OwnLease`].
    pub lease_sharing: LeaseSharing,
    /// The longest the lock may be held, counted from the grant: at this point the
    /// renewal engine stops keeping it and gives it back, and the guard is lost with
    /// [`LossReason::HoldCapReached`](crate::LossReason). For a holder that is alive but
    /// stuck, which automatic renewal would otherwise keep holding for ever. Default:
    /// none.
    pub max_hold: Option<Duration>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            renewal: Renewal::Auto,
            clock_drift: None,
            backoff: Backoff::default(),
            request_timeout: Duration::from_secs(5),
            holder_label: None,
            lease_sharing: LeaseSharing::OwnLease,
            max_hold: None,
        }
    }
}

impl AcquireOptions {
    /// The clock-drift allowance in force for these options.
    pub fn drift_allowance(&self) -> Duration {
        self.clock_drift
            .unwrap_or_else(|| default_drift_allowance(self.ttl))
    }
}

/// The default clock-drift allowance for a TTL: 1% plus 2 ms, as in the Redlock analysis.
pub fn default_drift_allowance(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// `instant + by`, or a far-future instant when that is not representable (a
/// `Duration::MAX` bound or backoff cap means "no limit", never a panic).
pub(crate) fn saturating_add(instant: Instant, by: Duration) -> Instant {
    instant.checked_add(by).unwrap_or_else(|| {
        // About thirty years: far beyond any wait, and representable on every platform.
        const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);
        instant.checked_add(FAR.min(by)).unwrap_or(instant)
    })
}

/// One wait, as the acquisition engine runs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitSpec {
    /// When to give up; `None` waits for ever.
    pub until: Option<Instant>,
    /// Pauses between attempts.
    pub backoff: Backoff,
    /// The longest one store request may take.
    pub request_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_grows() {
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(80),
        };
        for attempt in 0..64 {
            assert!(backoff.pause(attempt) <= Duration::from_millis(80));
        }
        assert!(backoff.pause(0) <= Duration::from_millis(10));
    }

    #[test]
    fn huge_wait_is_forever() {
        assert_eq!(
            Wait::UpTo(Duration::MAX).deadline_from(crate::values::clock::now()),
            None
        );
    }
}
