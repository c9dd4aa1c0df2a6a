//! The etcd leases idempotency records expire with: one shared lease per retention,
//! reused by every record written with that retention for a while, instead of a lease
//! granted for each write (a round trip, and a lease per record for the server to keep).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a record may outlive its retention because its lease is shared.
const MAX_SLACK_SECONDS: i64 = 3600;

/// The record leases of one client, by retention in whole seconds.
#[derive(Debug, Default)]
pub(crate) struct RecordLeases {
    leases: Mutex<HashMap<i64, Shared>>,
}

#[derive(Debug, Clone, Copy)]
struct Shared {
    id: i64,
    /// Until when a record written under it still lives its whole retention.
    reusable_until: Instant,
}

/// A lease to ask etcd for: `ttl` seconds, reusable until `reusable_until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) ttl: i64,
    reusable_until: Instant,
}

impl RecordLeases {
    /// The shared lease a record kept `retention` seconds may be written with now, if
    /// one lives long enough; otherwise what to grant (see [`granted`](Self::granted)).
    pub(crate) fn lease_for(&self, retention: i64) -> Result<i64, Wanted> {
        // Measured before the grant is sent: etcd starts the TTL when it applies the grant,
        // later, so the lease outlives `reusable_until + retention` on the server.
        let now = Instant::now();
        if let Some(shared) = self.lock().get(&retention) {
            if now < shared.reusable_until {
                return Ok(shared.id);
            }
        }
        let slack = slack(retention);
        // One second more covers the server's clock counting whole seconds, and running
        // a little faster than ours.
        Err(Wanted {
            ttl: retention.saturating_add(slack).saturating_add(1),
            reusable_until: now + Duration::from_secs(slack.unsigned_abs()),
        })
    }

    /// Keeps the lease granted for `wanted` for the next records of `retention`.
    pub(crate) fn granted(&self, retention: i64, wanted: Wanted, id: i64) {
        self.lock().insert(
            retention,
            Shared {
                id,
                reusable_until: wanted.reusable_until,
            },
        );
    }

    /// Forgets lease `id`, which etcd no longer has (revoked by hand, or a cluster
    /// restored from an older snapshot).
    pub(crate) fn gone(&self, retention: i64, id: i64) {
        let mut leases = self.lock();
        if leases.get(&retention).is_some_and(|shared| shared.id == id) {
            leases.remove(&retention);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Shared>> {
        // The map holds no invariant a panicking holder could break half-way.
        self.leases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How long a shared lease is reused, which is also how much later than its retention a
/// record may expire: an eighth of the retention, at least a second, at most an hour.
fn slack(retention: i64) -> i64 {
    (retention / 8).clamp(1, MAX_SLACK_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_lease_outlives_every_record_written_under_it() {
        let leases = RecordLeases::default();
        let Err(wanted) = leases.lease_for(60) else {
            panic!("a lease before any was granted");
        };
        // Reused for 7 s (an eighth of 60), so it must live 60 + 7 s, and one more.
        assert_eq!(wanted.ttl, 68);
        leases.granted(60, wanted, 42);
        assert_eq!(leases.lease_for(60), Ok(42));
        assert!(leases.lease_for(61).is_err(), "another retention shares it");
        leases.gone(60, 41);
        assert_eq!(
            leases.lease_for(60),
            Ok(42),
            "another lease's loss forgot it"
        );
        leases.gone(60, 42);
        assert!(leases.lease_for(60).is_err());
    }

    #[test]
    fn a_lease_past_its_reuse_window_is_not_handed_out() {
        let leases = RecordLeases::default();
        let Err(mut wanted) = leases.lease_for(1) else {
            panic!("a lease before any was granted");
        };
        assert_eq!(wanted.ttl, 3);
        wanted.reusable_until = Instant::now();
        leases.granted(1, wanted, 7);
        assert!(leases.lease_for(1).is_err());
    }

    #[test]
    fn the_slack_is_bounded() {
        assert_eq!(slack(1), 1);
        assert_eq!(slack(80), 10);
        assert_eq!(slack(30 * 365 * 86_400), MAX_SLACK_SECONDS);
    }
}
