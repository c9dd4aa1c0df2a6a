//! The suite proves it can fail: deliberately broken variants of the in-memory backend
//! must each be caught by the scenarios named for them.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::scenarios::{Offers, ALL};
use conformance_tests::{BackendFactory, Ctx, LinkControl};
use lock_core::backend::async_trait;
use lock_core::backend::{
    AcquireRequest, DynBackend, Grant, HolderInfo, LockBackend, Ownership, Session, SessionKeeper,
};
use lock_core::{Capabilities, FencingToken, LeaseId, LockKey, MemoryBackend, Renewal, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defect {
    /// Release removes whatever lease holds the key.
    ReleaseWithoutOwnerCheck,
    /// Renewing an expired lease grants it again.
    RenewalAfterExpiry,
    /// A new owner gets the previous owner's token.
    TokenNotIncrementedOnTakeover,
    /// A retried acquire whose first reply was lost finds "its" key held.
    LostReplyTreatedAsFailure,
    /// A session keep-alive proves the session alive from when its reply arrived, not
    /// from when it was sent.
    KeepAliveMeasuredFromReply,
    /// Listing takes `_` in the prefix for any one character, as an unescaped SQL `LIKE`
    /// pattern would.
    ListedByLikePattern,
}

#[derive(Debug)]
struct Defective {
    inner: MemoryBackend,
    defect: Defect,
    last_grant: Arc<Mutex<HashMap<LockKey, (LeaseId, FencingToken)>>>,
    /// The sessions as this client re-reports them, by the inner session's id.
    sessions: Mutex<HashMap<u64, Arc<SessionKeeper>>>,
}

impl Defective {
    /// Re-reports `session` the defective way: each keep-alive as if sent when its reply
    /// arrived.
    fn measured_from_reply(&self, session: &Session) -> Session {
        let mut sessions = self.sessions.lock().unwrap();
        if let Some(keeper) = sessions.get(&session.id()) {
            return keeper.session();
        }
        let status = session.status();
        let keeper = Arc::new(SessionKeeper::new(status.proven_at, status.ttl));
        sessions.insert(session.id(), keeper.clone());
        let mut inner = session.clone();
        tokio::spawn(async move {
            while inner.changed().await {
                let status = inner.status();
                if status.expired {
                    keeper.expired();
                    return;
                }
                if status.disconnected {
                    keeper.disconnected();
                } else {
                    keeper.kept_alive(Instant::now());
                }
            }
        });
        sessions[&session.id()].session()
    }
}

#[async_trait]
impl LockBackend for Defective {
    fn name(&self) -> &'static str {
        "defective"
    }

    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        match self.defect {
            Defect::KeepAliveMeasuredFromReply => {
                let grant = self.inner.try_acquire(request).await?;
                Ok(grant.map(|grant| match grant.session() {
                    Some(session) => {
                        Grant::in_session(grant.token(), self.measured_from_reply(session))
                    }
                    None => grant,
                }))
            }
            Defect::LostReplyTreatedAsFailure => {
                let holder = self.inner.inspect(request.key()).await?;
                if holder.is_some_and(|info| info.lease_id == request.lease_id()) {
                    return Ok(None);
                }
                self.inner.try_acquire(request).await
            }
            Defect::TokenNotIncrementedOnTakeover => {
                let Some(token) = self.inner.try_acquire(request).await?.map(|g| g.token()) else {
                    return Ok(None);
                };
                let mut grants = self.last_grant.lock().unwrap();
                let token = match grants.get(request.key()) {
                    Some((_, previous)) => *previous,
                    None => token,
                };
                grants.insert(request.key().clone(), (request.lease_id(), token));
                Ok(Some(Grant::new(token)))
            }
            _ => self.inner.try_acquire(request).await,
        }
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let renewed = self.inner.renew(key, lease_id, ttl).await?;
        if renewed == Ownership::NotHeld && self.defect == Defect::RenewalAfterExpiry {
            let request = AcquireRequest::new(key.clone(), ttl, Duration::ZERO, Renewal::Manual)
                .with_lease_id(lease_id);
            let taken = self.inner.try_acquire(&request).await?.is_some();
            return Ok(Ownership::held_if(taken));
        }
        Ok(renewed)
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        if self.defect == Defect::ReleaseWithoutOwnerCheck {
            if let Some(holder) = self.inner.inspect(key).await? {
                return self.inner.release(key, holder.lease_id).await;
            }
        }
        self.inner.release(key, lease_id).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        self.inner.inspect(key).await
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        if self.defect != Defect::ListedByLikePattern {
            return self.inner.list_held(prefix, limit).await;
        }
        let matches = |key: &str| {
            key.chars().count() >= prefix.chars().count()
                && key
                    .chars()
                    .zip(prefix.chars())
                    .all(|(k, p)| p == '_' || k == p)
        };
        let all = self.inner.list_held("", usize::MAX).await?;
        Ok(all
            .into_iter()
            .filter(|(key, _)| matches(key.as_str()))
            .take(limit)
            .collect())
    }

    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.stored_keys(prefix).await
    }
}

struct DefectiveFactory {
    store: MemoryBackend,
    defect: Defect,
    last_grant: Arc<Mutex<HashMap<LockKey, (LeaseId, FencingToken)>>>,
}

impl DefectiveFactory {
    fn client(&self) -> Defective {
        Defective {
            inner: self.store.client(),
            defect: self.defect,
            last_grant: self.last_grant.clone(),
            sessions: Mutex::default(),
        }
    }
}

#[async_trait]
impl BackendFactory for DefectiveFactory {
    fn name(&self) -> String {
        format!("{:?}", self.defect)
    }

    async fn connect(&self) -> Result<DynBackend> {
        Ok(Arc::new(self.client()))
    }

    async fn connect_with_link(&self) -> Option<Result<(DynBackend, Arc<dyn LinkControl>)>> {
        let client = self.client();
        let link = client.inner.link()?;
        Some(Ok((Arc::new(client), Arc::new(link))))
    }
}

/// Runs every scenario on the defective backend and returns the names of those that failed.
fn failing_scenarios(defect: Defect) -> BTreeSet<&'static str> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = match defect {
        Defect::KeepAliveMeasuredFromReply => MemoryBackend::new().with_sessions(),
        _ => MemoryBackend::new(),
    };
    let factory: Arc<dyn BackendFactory> = Arc::new(DefectiveFactory {
        store,
        defect,
        last_grant: Arc::default(),
    });
    runtime.block_on(async {
        let offers = Offers::probe(factory.as_ref()).await.unwrap();
        let caps = offers.capabilities.clone();
        let mut runs = tokio::task::JoinSet::new();
        for scenario in ALL.iter().filter(|s| s.not_applicable(&offers).is_none()) {
            let (factory, caps) = (factory.clone(), caps.clone());
            runs.spawn(async move {
                let ctx = Ctx::new(factory, caps);
                let outcome =
                    tokio::time::timeout(Duration::from_secs(60), (scenario.run)(&ctx)).await;
                ctx.cleanup().await;
                (scenario.name, matches!(outcome, Ok(Ok(()))))
            });
        }
        let mut failed = BTreeSet::new();
        while let Some(done) = runs.join_next().await {
            let (name, passed) = done.unwrap();
            if !passed {
                failed.insert(name);
            }
        }
        failed
    })
}

fn assert_caught(defect: Defect, expected: &[&str]) {
    let failed = failing_scenarios(defect);
    for name in expected {
        assert!(
            failed.contains(name),
            "{defect:?} was not caught by {name}; failing scenarios: {failed:?}"
        );
    }
}

#[test]
fn release_without_owner_check_is_caught() {
    assert_caught(
        Defect::ReleaseWithoutOwnerCheck,
        &[
            "only_the_owner_releases",
            "release_is_idempotent",
            "expiry_then_takeover",
        ],
    );
}

#[test]
fn renewal_after_expiry_is_caught() {
    assert_caught(
        Defect::RenewalAfterExpiry,
        &["expired_lease_is_lost_even_if_untaken"],
    );
}

#[test]
fn token_not_incremented_on_takeover_is_caught() {
    assert_caught(
        Defect::TokenNotIncrementedOnTakeover,
        &[
            "tokens_strictly_increase",
            "history_is_serial_with_increasing_tokens",
            "stale_holder_is_fenced_out",
            "expiry_then_takeover",
        ],
    );
}

#[test]
fn lost_reply_treated_as_failure_is_caught() {
    assert_caught(
        Defect::LostReplyTreatedAsFailure,
        &["ambiguous_acquire_resolves_on_retry"],
    );
}

#[test]
fn keep_alive_measured_from_reply_is_caught() {
    assert_caught(
        Defect::KeepAliveMeasuredFromReply,
        &["keep_alive_is_measured_from_its_send"],
    );
}

#[test]
fn listing_by_like_pattern_is_caught() {
    assert_caught(
        Defect::ListedByLikePattern,
        &["hostile_keys_stay_in_their_namespace"],
    );
}
