//! Lock sets on the SQL backend: [`LockBackend::try_acquire_all`] as one transaction
//! (see `dialect/sets.rs`).
//!
//! [`LockBackend::try_acquire_all`]: lock_core::backend::LockBackend::try_acquire_all

use std::sync::Arc;

use lock_core::backend::{finish_if_dropped, AcquireRequest, Grant};
use lock_core::Result;

use super::{SqlBackend, Store};

impl SqlBackend {
    /// Grants every request in one transaction, or none: [`LockBackend::try_acquire_all`].
    ///
    /// Every lease id of the set counts as running an acquire statement until the
    /// transaction ends, so a release of any of them waits for it, as it waits for a
    /// single acquire (see `InFlight`).
    ///
    /// [`LockBackend::try_acquire_all`]: lock_core::backend::LockBackend::try_acquire_all
    pub(super) async fn acquire_all(
        &self,
        requests: &[AcquireRequest],
    ) -> Result<Option<Vec<Grant>>> {
        let mut members = Vec::with_capacity(requests.len());
        for request in requests {
            members.push((
                request.key().clone(),
                request.lease_id(),
                self.ttl_ms(request.store_ttl())?,
                request.holder_label().map(str::to_owned),
            ));
        }
        let mut running = Vec::with_capacity(requests.len());
        for request in requests {
            running.push(self.inner.in_flight.start(request.lease_id()).await);
        }
        let inner = Arc::clone(&self.inner);
        // Runs to completion even if the caller gives up, then opens the gates.
        finish_if_dropped(async move {
            let result = on_store!(&inner.store, ops => ops.acquire_all(&members).await);
            drop(running);
            result.map(|granted| granted.map(|tokens| tokens.into_iter().map(Grant::new).collect()))
        })
        .await
    }
}
