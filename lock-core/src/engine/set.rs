//! A lock set taken in one atomic step, on a store that can
//! ([`Capabilities::atomic_sets`](crate::Capabilities::atomic_sets)).

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::backend::{AcquireRequest, LockBackendExt};
use crate::engine::acquire::check_options;
use crate::engine::cleanup::{Cleanup, CleanupOf};
use crate::engine::held::HeldLock;
use crate::engine::poll::{wait_for_grant, WaitStart, Wakes};
use crate::engine::{outcome_name, ClientCore};
use crate::values::error::{ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::Lease;
use crate::values::options::{AcquireOptions, Wait, WaitSpec};

/// Takes every key of `keys` (mutex keys, in canonical order) in one store step per
/// attempt, waiting per `options`, and hands the leases to the client's renewal engine.
/// A failed or abandoned acquisition releases every lease id it may have been granted.
pub(crate) async fn acquire_set(
    core: &Arc<ClientCore>,
    keys: Vec<LockKey>,
    options: AcquireOptions,
) -> Result<Vec<Arc<HeldLock>>> {
    core.refuse_if_shut_down()?;
    check_options(&core.backend, &options)?;
    let backend = &core.backend;
    let span = tracing::info_span!(
        "distlock.acquire_set",
        backend = backend.name(),
        keys = keys.len(),
        outcome = tracing::field::Empty,
    );
    let started = crate::values::clock::now();
    let requests: Vec<AcquireRequest> = keys
        .into_iter()
        .map(|key| {
            AcquireRequest::new(key, options.ttl, options.drift_allowance(), options.renewal)
                .with_holder_label(options.holder_label.clone())
                .for_store(backend.capabilities())
        })
        .collect();
    let mut cleanup = SetCleanup {
        core: Arc::clone(core),
        requests: requests.clone(),
        options: options.clone(),
        armed: true,
    };
    let single_try = matches!(options.wait, Wait::No | Wait::UpTo(Duration::ZERO));
    let attempt = |timeout| backend.acquire_all_once(&requests, timeout);
    let result = async {
        if single_try {
            return attempt(options.request_timeout).await;
        }
        let spec = WaitSpec {
            until: options.wait.deadline_from(started),
            backoff: options.backoff,
            request_timeout: options.request_timeout,
        };
        // Woken by releases of the first key where the store notifies; the others are
        // polled with backoff.
        let subscribing = backend
            .capabilities()
            .native_notification
            .then(|| backend.watch(requests[0].key()));
        let start = WaitStart {
            wakes: Wakes::Herd,
            store_answered: false,
        };
        wait_for_grant(requests[0].key(), &spec, start, subscribing, attempt).await
    }
    .instrument(span.clone())
    .await;
    span.record("outcome", outcome_name(&result));
    let leases: Vec<Lease> = match result {
        Ok(leases) => leases,
        Err(err) => {
            // Nothing was sent, or the only attempt got a definite "held": the store holds
            // nothing of ours.
            if matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported)
                || (single_try && err.kind() == ErrorKind::HeldByAnother)
            {
                cleanup.armed = false;
            }
            return Err(err);
        }
    };
    cleanup.armed = false;
    let mut held = Vec::with_capacity(leases.len());
    for (request, lease) in requests.iter().zip(leases) {
        let release_again = request
            .had_unanswered_attempt()
            .then_some(options.request_timeout);
        // A shutdown meanwhile gives this lease back; the ones held so far go back with
        // their guards when `held` is dropped.
        held.push(
            HeldLock::start_unless_shut_down(core, lease, options.clone(), release_again, None)
                .await?,
        );
    }
    Ok(held)
}

/// Releases every lease id of a set whose acquisition failed or was abandoned: the attempt
/// that went unanswered (or is still on its way) may have granted all of them.
struct SetCleanup {
    core: Arc<ClientCore>,
    requests: Vec<AcquireRequest>,
    options: AcquireOptions,
    armed: bool,
}

impl Drop for SetCleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The set's attempts are counted on its first request; one still on its way lands
        // within about a request timeout.
        let again = self.requests[0]
            .may_land_late()
            .then_some(self.options.request_timeout);
        let schedule: Vec<Duration> = std::iter::once(Duration::ZERO).chain(again).collect();
        for request in &self.requests {
            CleanupOf {
                what: Cleanup::Release,
                key: request.key().clone(),
                lease_id: request.lease_id(),
                timeout: self.options.request_timeout,
                ttl: self.options.ttl,
            }
            .spawn(&self.core.backend, &schedule);
        }
    }
}
