//! What the engine tells operators, the same for every backend: `tracing` spans and
//! [`metrics`](https://docs.rs/metrics) facade measurements.
//!
//! The spans (`distlock.acquire`, `distlock.wait` in the local line or at the store,
//! `distlock.renew` per lease and `distlock.renew_batch` per call, `distlock.release`,
//! `distlock.break`) carry the backend's name, the key, the first [`LEASE_PREFIX`] hex
//! digits of the lease id and the outcome; each keep-alive of a session store (the session
//! pool's, and etcd's over its stream) runs in `distlock.keep_alive` (backend, session id,
//! kind, outcome). Never the whole lease id: whoever knows it can release the lease, so it
//! is as good as a secret. Store URLs (with their passwords) never appear.
//!
//! The metrics go through the `metrics` facade: without a recorder installed by the
//! program (a Prometheus exporter, say) they cost a few atomic loads and go nowhere.
//! Every metric carries the label `backend` (the store's name: `memory`, `sqlite`,
//! `redis`, ...). Keys are **not** labels, since their number is unbounded; for one key,
//! `distlock status KEY --watch` shows what the store tells of it.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | [`ACQUISITIONS`] `distlock_acquisitions_total` | counter | `backend`, `outcome` | acquisitions that ended, by outcome (`ok`, `held_by_another`, `timed_out`, `unavailable`, ...) |
//! | [`ACQUIRE_WAIT`] `distlock_acquire_wait_seconds` | histogram | `backend`, `outcome` | how long an acquisition took, waiting included |
//! | [`HOLD`] `distlock_hold_seconds` | histogram | `backend`, `end` | how long a lock was held, from the grant to its end (`released` or `lost`) |
//! | [`RENEWAL_LATENCY`] `distlock_renewal_seconds` | histogram | `backend` | how long one renewal call took (a batch counts once) |
//! | [`RENEWAL_FAILURES`] `distlock_renewal_failures_total` | counter | `backend`, `outcome` | renewals that were not answered or failed, by error kind (a lease then goes [`Suspended`](crate::LeaseHealth::Suspended)) |
//! | [`LOSSES`] `distlock_losses_total` | counter | `backend`, `reason` | locks lost, by [`LossReason`](crate::LossReason) (`deadline_passed`, `not_held`, `session_ended`, `hold_cap_reached`) |
//! | [`WAITERS`] `distlock_waiters` | gauge | `backend` | tasks of this process waiting for a lock right now |

use std::time::{Duration, Instant};

use crate::values::lease::LeaseId;

/// Counter: acquisitions that ended, labelled `backend` and `outcome`.
pub const ACQUISITIONS: &str = "distlock_acquisitions_total";
/// Histogram (seconds): how long an acquisition took, labelled `backend` and `outcome`.
pub const ACQUIRE_WAIT: &str = "distlock_acquire_wait_seconds";
/// Histogram (seconds): how long a lock was held, labelled `backend` and `end`
/// (`released` or `lost`).
pub const HOLD: &str = "distlock_hold_seconds";
/// Histogram (seconds): how long one renewal call took, labelled `backend`.
pub const RENEWAL_LATENCY: &str = "distlock_renewal_seconds";
/// Counter: renewals that failed without a verdict on the lease, labelled `backend` and
/// `outcome` (the error kind).
pub const RENEWAL_FAILURES: &str = "distlock_renewal_failures_total";
/// Counter: locks lost, labelled `backend` and `reason`.
pub const LOSSES: &str = "distlock_losses_total";
/// Gauge: tasks of this process waiting for a lock, labelled `backend`.
pub const WAITERS: &str = "distlock_waiters";

/// Hex digits of a lease id that spans show: enough to tell leases apart in a log, far too
/// few to act on the lease.
pub const LEASE_PREFIX: usize = 8;

/// The part of `id` that spans and logs show.
pub(crate) fn lease_prefix(id: LeaseId) -> String {
    let mut shown = id.to_string();
    shown.truncate(LEASE_PREFIX);
    shown
}

/// An acquisition ended.
pub(crate) fn acquired(backend: &'static str, outcome: &'static str, started: Instant) {
    let labels = [("backend", backend), ("outcome", outcome)];
    metrics::counter!(ACQUISITIONS, &labels).increment(1);
    metrics::histogram!(ACQUIRE_WAIT, &labels).record(crate::values::clock::since(started));
}

/// A hold ended, released or lost.
pub(crate) fn hold_ended(backend: &'static str, lost: bool, held: Duration) {
    let end = if lost { "lost" } else { "released" };
    metrics::histogram!(HOLD, "backend" => backend, "end" => end).record(held);
}

/// One renewal call was answered (or timed out) after `took`.
pub(crate) fn renewal_call(backend: &'static str, took: Duration) {
    metrics::histogram!(RENEWAL_LATENCY, "backend" => backend).record(took);
}

/// A renewal failed without a verdict on the lease.
pub(crate) fn renewal_failed(backend: &'static str, outcome: &'static str) {
    metrics::counter!(RENEWAL_FAILURES, "backend" => backend, "outcome" => outcome).increment(1);
}

/// A lock was lost.
pub(crate) fn lost(backend: &'static str, reason: &'static str) {
    metrics::counter!(LOSSES, "backend" => backend, "reason" => reason).increment(1);
}

/// Counts a task in [`WAITERS`] for as long as it lives (cancellation included).
pub(crate) struct Waiter(&'static str);

impl Waiter {
    pub(crate) fn count(backend: &'static str) -> Self {
        metrics::gauge!(WAITERS, "backend" => backend).increment(1.0);
        Waiter(backend)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        metrics::gauge!(WAITERS, "backend" => self.0).decrement(1.0);
    }
}

#[cfg(test)]
mod tests;
