//! Lock sets: several keys held as one, all or none.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use crate::client::guard::LockGuard;
use crate::client::request::LockRequest;
use crate::engine::held::LossReason;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::LockKey;
use crate::values::lease::FencingToken;

/// A request for every key of a set ([`LockClient::lock_all`](crate::LockClient::lock_all)):
/// the lock request's builder, whose options apply to each key and whose wait bounds the
/// whole set. `.await` it for a [`LockSet`].
pub type LockSetRequest = LockRequest<Vec<LockKey>>;

/// Several keys held as one ([`LockClient::lock_all`](crate::LockClient::lock_all)): each
/// with its own lease and fencing token, given back together.
///
/// On a store with [`atomic_sets`](crate::Capabilities::atomic_sets) each attempt takes
/// every key in one atomic step or none (a set waits holding nothing). On the others the
/// keys are taken one at a time in their canonical order (sorted, each once), so two
/// callers whose sets overlap take the keys they share in the same order and cannot
/// deadlock, and an acquisition that fails or is cancelled part way gives back what it had
/// taken; between the first grant and the last, the first keys are held while the set
/// waits for the others.
#[derive(Debug)]
#[must_use = "dropping the set releases every key"]
pub struct LockSet {
    guards: Vec<LockGuard>,
}

impl LockSet {
    /// The guards of the set's keys, in canonical (sorted) order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The keys of the set, in canonical (sorted) order.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The fencing token `key` is held with, if it is in the set.
    pub fn token(&self, key: impl AsRef<str>) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|guard| guard.key().as_str() == key.as_ref())
            .map(LockGuard::token)
    }

    /// Whether every key of the set is still held (its local deadline ahead). Cheap: no
    /// store call.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when the first key of the set is lost, with that key and why: from then
    /// on the set no longer protects what needs all of its keys. Never resolves for a set
    /// released whole.
    pub fn lost(&self) -> impl Future<Output = (LockKey, LossReason)> + Send + 'static {
        let losses: Vec<_> = self
            .guards
            .iter()
            .map(|guard| {
                let key = guard.key().clone();
                let lost = guard.lost();
                Box::pin(async move { (key, lost.await) })
            })
            .collect();
        async move { futures_util::future::select_all(losses).await.0 }
    }

    /// Gives every key back, all at once. `Ok(())` when every key was held until now;
    /// otherwise the first error, [`ErrorKind::Lost`](crate::ErrorKind) when a key had
    /// been lost. Every key is given back either way.
    pub async fn release(self) -> Result<()> {
        let releases = self.guards.into_iter().map(LockGuard::release);
        futures_util::future::join_all(releases)
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()
            .map(drop)
    }
}

impl IntoFuture for LockSetRequest {
    type Output = Result<LockSet>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<LockSet>> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        let options = self.effective_options();
        let (core, owner, keys) = (self.core, self.owner, self.key);
        Box::pin(async move {
            let keys = keys?;
            if owner.is_none() && core.backend.capabilities().atomic_sets {
                let held = crate::engine::set::acquire_set(&core, keys, options).await?;
                let guards = held
                    .into_iter()
                    .map(|held| LockGuard::new(held, None))
                    .collect();
                return Ok(LockSet { guards });
            }
            let started = crate::values::clock::now();
            let mut guards = Vec::with_capacity(keys.len());
            for key in keys {
                let options = crate::AcquireOptions {
                    wait: options.wait.remaining_from(started),
                    ..options.clone()
                };
                let request = LockRequest::new(core.clone(), owner.clone(), Ok(key), options);
                match request.await {
                    Ok(guard) => guards.push(guard),
                    Err(err) => {
                        // What was taken goes back before the caller hears of the failure
                        // (and in the background, should this future be dropped first).
                        let _ = LockSet { guards }.release().await;
                        return Err(err);
                    }
                }
            }
            Ok(LockSet { guards })
        })
    }
}

/// The keys of a set in canonical order: parsed, sorted, each once. An empty set is
/// [`ErrorKind::InvalidInput`].
pub(crate) fn canonical<I, K>(keys: I) -> Result<Vec<LockKey>>
where
    I: IntoIterator<Item = K>,
    K: AsRef<str>,
{
    let mut keys = keys
        .into_iter()
        .map(LockKey::new)
        .collect::<Result<Vec<_>>>()?;
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, "the lock set is empty"));
    }
    Ok(keys)
}
