//! The one clock the core reads: Tokio's. It is the system's monotonic clock, except in a
//! test runtime whose clock is paused (`start_paused`), where it moves only as the runtime
//! advances it: a simulation then runs TTLs of seconds in no time, and every deadline of
//! the core (leases, waits, renewals, the memory store's expiry) moves with it.

use std::time::Instant;

/// Now, on the clock every deadline of the core is measured by. A backend measures the
/// send times it reports (proofs of life) with it too.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `start` (read from [`now`]) was, on the same clock: `Instant::elapsed`
/// reads the system clock, which a paused runtime does not move.
pub(crate) fn since(start: Instant) -> std::time::Duration {
    now().saturating_duration_since(start)
}
