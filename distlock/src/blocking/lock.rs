//! Lock requests and guards of the blocking client.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use super::runtime::{stopped, CallerThread, Runtime};
use lock_core::{FencingToken, Lease, LeaseHealth, LockKey, LockScope, LossReason, Renewal, Wait};

use crate::{Error, ErrorKind, Result};

/// A blocking lock request: refine it, then [`acquire`](Self::acquire) it for a guard.
#[must_use = "a lock request does nothing until acquired"]
#[derive(Debug)]
pub struct LockRequest {
    pub(super) request: crate::LockRequest,
    pub(super) runtime: Arc<Runtime>,
}

impl LockRequest {
    /// How long the store keeps the lease without renewal; the client's runtime renews it
    /// while the guard lives.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.request = self.request.ttl(ttl);
        self
    }

    /// How long to wait for a held key.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.request = self.request.wait(wait);
        self
    }

    /// Waits at most `bound`, then fails with [`ErrorKind::TimedOut`].
    pub fn wait_up_to(self, bound: Duration) -> Self {
        self.wait(Wait::UpTo(bound))
    }

    /// Fails at once with [`ErrorKind::HeldByAnother`] if the key is held.
    pub fn no_wait(self) -> Self {
        self.wait(Wait::No)
    }

    /// Who keeps the lease alive: with [`Renewal::Manual`] the holder calls
    /// [`LockGuard::renew`] itself before the TTL runs out.
    pub fn renewal(mut self, renewal: Renewal) -> Self {
        self.request = self.request.renewal(renewal);
        self
    }

    /// Labels the holder for [`LockClient::inspect`](super::LockClient::inspect).
    pub fn holder_label(mut self, label: impl AsRef<str>) -> Self {
        self.request = self.request.holder_label(label);
        self
    }

    /// Blocks until the lock is granted, or fails as the async request does
    /// ([`ErrorKind::HeldByAnother`], [`ErrorKind::TimedOut`], ...).
    pub fn acquire(self) -> Result<LockGuard> {
        let guard = self.runtime.wait(self.request.into_future())?;
        Ok(LockGuard {
            key: guard.key().clone(),
            token: guard.token(),
            guard: Some(guard),
            runtime: self.runtime,
        })
    }

    /// Acquires the lock, runs `body` on this thread while it is held, then releases it;
    /// the blocking form of [`LockRequest::scoped`](crate::LockRequest::scoped).
    ///
    /// A thread cannot be stopped from outside, so where the async form drops its body the
    /// moment the lock is lost, this one lets `body` run to its end and then fails with
    /// [`ErrorKind::Lost`], dropping the body's value: what it did after the loss was not
    /// protected, and the caller must treat its outcome as unknown. A body that should
    /// stop early checks [`LockScope::is_held`] between its steps. A loss the release
    /// finds (the store dropped the lease behind the holder's back) is reported the same
    /// way. The key is given back at the loss already, not when the body returns.
    /// Acquisition errors are returned as they come; the body's own errors are part of its
    /// value `T`.
    ///
    /// ```
    /// # fn main() -> distlock::Result<()> {
    /// let client = distlock::blocking::connect("memory://blocking-scoped")?;
    /// let written = client
    ///     .lock("ledger")
    ///     .scoped(|scope| format!("written under token {}", scope.token()))?;
    /// assert!(written.starts_with("written under token"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn scoped<T>(self, body: impl FnOnce(LockScope) -> T) -> Result<T> {
        let request = self.request;
        let (outcome, value) = self.runtime.serve(
            move |caller: CallerThread<_, ()>| {
                request.scoped(move |scope| async move { caller.run(scope).await })
            },
            |scope| ((), body(scope)),
        );
        outcome?;
        value.ok_or_else(stopped)
    }
}

/// Proof of holding a lock, blocking.
///
/// [`release`](Self::release) gives the lock back and says whether the lease was held
/// until then. Dropping the guard releases too, and also waits for the store (bounded by
/// the request time-out), so the key is free when the drop returns; a failure there is
/// only logged, and the lease then ends by its TTL.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct LockGuard {
    pub(super) key: LockKey,
    pub(super) token: FencingToken,
    /// Taken only by `release` and by the drop, which end the guard.
    pub(super) guard: Option<crate::LockGuard>,
    pub(super) runtime: Arc<Runtime>,
}

impl LockGuard {
    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token of this ownership: pass it to every resource the lock protects.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Whether the lease is held and its local deadline is ahead. Cheap: no store call.
    pub fn is_held(&self) -> bool {
        self.guard.as_ref().is_some_and(crate::LockGuard::is_held)
    }

    /// Why the lease was lost, once it was; `None` while it is held.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.guard.as_ref().and_then(crate::LockGuard::loss_reason)
    }

    /// The current lease (its deadline moves with each renewal).
    pub fn lease(&self) -> Option<Lease> {
        self.guard.as_ref().map(crate::LockGuard::lease)
    }

    /// How the lease is doing: [`LeaseHealth::Suspended`] as soon as a renewal fails,
    /// before the lease is lost; see [`LockGuard::health`](crate::LockGuard::health).
    pub fn health(&self) -> LeaseHealth {
        self.guard
            .as_ref()
            .map_or(LeaseHealth::Healthy, crate::LockGuard::health)
    }

    /// Waits up to `bound` for the lease to be lost: the reason if it was (at once if it
    /// already is), `None` if it is still held when `bound` ends. The blocking form of
    /// [`LockGuard::lost`](crate::LockGuard::lost), whose docs say when a loss fires.
    pub fn lost_within(&self, bound: Duration) -> Option<LossReason> {
        let lost = self.guard.as_ref()?.lost();
        self.runtime
            .wait(async move { Ok(tokio::time::timeout(bound, lost).await.ok()) })
            .ok()
            .flatten()
    }

    /// Renews the lease now, for [`Renewal::Manual`] (allowed with automatic renewal
    /// too): [`ErrorKind::Lost`] when it is no longer held, as
    /// [`LockGuard::renew`](crate::LockGuard::renew).
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::Renewal;
    ///
    /// # fn main() -> distlock::Result<()> {
    /// let client = distlock::blocking::connect("memory://blocking-renew")?;
    /// let guard = client
    ///     .lock("batch")
    ///     .ttl(Duration::from_secs(10))
    ///     .renewal(Renewal::Manual)
    ///     .acquire()?;
    /// for step in 0..3 {
    ///     // ... one step of the work, shorter than the TTL ...
    ///     guard.renew()?; // the lease runs for another TTL from here
    /// #   let _ = step;
    /// }
    /// guard.release()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn renew(&self) -> Result<()> {
        let Some(guard) = self.guard.as_ref() else {
            return Err(Error::new(ErrorKind::Lost, "the guard was released"));
        };
        self.runtime.wait_borrowing(guard.renew())
    }

    /// Gives the lock back: `Ok(())` when the lease was held until now,
    /// [`ErrorKind::Lost`] when it had been lost (what ran after that was not protected).
    pub fn release(mut self) -> Result<()> {
        match self.guard.take() {
            Some(guard) => self.runtime.wait(guard.release()),
            None => Ok(()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let key = self.key.clone();
            if let Err(err) = self.runtime.wait(guard.release()) {
                tracing::debug!(%key, error = %err, "release of a dropped blocking guard: {err}");
            }
        }
    }
}
