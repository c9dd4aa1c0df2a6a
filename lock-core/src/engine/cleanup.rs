//! Clean-ups that must reach the store: the release of a lease nobody holds any more (lost,
//! dropped, abandoned mid-flight, handed over to nobody) and the exit of a waiter that gave
//! up its place in a fair queue.
//!
//! A clean-up runs in a task of its own, so that a cancelled caller still cleans up. One
//! try is not enough: on a session-bound store (etcd, ZooKeeper) an entry lives as long as
//! the client's shared session, which its keep-alives may renew for as long as the process
//! runs, so a clean-up that failed during a network blip would block the key for ever. A
//! failed clean-up is therefore retried with backoff until the store answers, or until the
//! entry has expired by itself (a store whose entries live by their own TTL). The task
//! keeps the client's backend meanwhile: on a session store the entry lives exactly as
//! long as the session, so the clean-up has to outlast it. Releasing a lease id nobody
//! holds, or leaving a queue one is not in, is always harmless, so retrying is safe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::unanswered;
use crate::backend::{with_timeout, DynBackend};
use crate::values::key::LockKey;
use crate::values::lease::LeaseId;
use crate::values::options::Backoff;

/// Pauses between tries of a failed clean-up: soon at first, then every few seconds at
/// most, so an outage of any length costs the store little and the key is free soon after
/// the store answers again.
const RETRY: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(2),
};

/// What a clean-up does in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// Releases the lease id, if the store has it.
    Release,
    /// Leaves the key's fair queue, if the lease id waits in it.
    LeaveQueue,
}

impl Cleanup {
    fn name(self) -> &'static str {
        match self {
            Cleanup::Release => "release",
            Cleanup::LeaveQueue => "leave_queue",
        }
    }
}

/// One clean-up of one lease id at one key, with the bounds it is tried within.
#[derive(Clone, Debug)]
pub(crate) struct CleanupOf {
    pub(crate) what: Cleanup,
    pub(crate) key: LockKey,
    pub(crate) lease_id: LeaseId,
    /// How long one try may take.
    pub(crate) timeout: Duration,
    /// The entry's TTL: on a store whose entries live by their TTL (not a session), a
    /// clean-up still failing that long after it began has nothing left to clean.
    pub(crate) ttl: Duration,
}

impl CleanupOf {
    /// Runs the clean-up in the background, once after each pause of `schedule` (each
    /// measured from the end of the previous run), every run retried until it is answered.
    /// Without a runtime the entry is left to its TTL or session.
    pub(crate) fn spawn(self, backend: &DynBackend, schedule: &[Duration]) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(key = %self.key, "no runtime to clean up on; the entry ends with its TTL or session");
            return;
        };
        let schedule = schedule.to_vec();
        let session_bound = backend.capabilities().session_bound();
        // The task keeps the backend until the store has answered: a client dropped with
        // its waiter (an aborted task) still leaves the queue. It holds plain data besides,
        // and spawns nothing from a drop.
        let backend = Arc::clone(backend);
        runtime.spawn(async move {
            let give_up = (!session_bound).then(|| {
                crate::values::options::saturating_add(
                    crate::values::clock::now(),
                    self.ttl.saturating_add(self.timeout),
                )
            });
            for pause in schedule {
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                if !self.run_until_answered(&backend, give_up).await {
                    return;
                }
            }
        });
    }

    /// Tries until the store answers; `false` when it stopped without an answer (the
    /// entry has expired anyway, or the store refused for good).
    async fn run_until_answered(&self, live: &DynBackend, give_up: Option<Instant>) -> bool {
        let (outcome, tries) = RETRY
            .retry_until(give_up, unanswered, || self.try_once(live))
            .await;
        let what = self.what.name();
        match outcome {
            Ok(()) => {
                if tries > 1 {
                    tracing::info!(key = %self.key, clean_up = what, tries, "clean-up done after the store answered again");
                }
                true
            }
            Err(err) if unanswered(&err) => {
                tracing::debug!(error = %err, key = %self.key, clean_up = what, tries, "clean-up unanswered until the entry expired by its TTL");
                false
            }
            Err(err) => {
                tracing::warn!(error = %err, key = %self.key, clean_up = what, "clean-up refused; the entry ends with its TTL or session");
                false
            }
        }
    }

    async fn try_once(&self, live: &DynBackend) -> crate::Result<()> {
        match self.what {
            Cleanup::Release => with_timeout(
                live.name(),
                self.timeout,
                "release",
                live.release(&self.key, self.lease_id),
            )
            .await
            .map(drop),
            Cleanup::LeaveQueue => {
                with_timeout(
                    live.name(),
                    self.timeout,
                    "leave_queue",
                    live.leave_queue(&self.key, self.lease_id),
                )
                .await
            }
        }
    }
}
