//! Lock sets on one node: [`LockBackend::try_acquire_all`] as one script
//! (`scripts/acquire_all.lua`, after `scripts/grant.lua`), so the server grants every key
//! of a set, or none, in one atomic step.
//!
//! [`LockBackend::try_acquire_all`]: lock_core::backend::LockBackend::try_acquire_all

use std::sync::LazyLock;

use lock_core::backend::{AcquireRequest, Grant, LockBackend};
use lock_core::{Error, ErrorKind, FencingToken, Primitive, Result};
use redis::Script;

use super::RedisBackend;
use crate::entry::{label_arg, ttl_millis};

static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../scripts/token.lua"),
        include_str!("../../scripts/grant.lua"),
        include_str!("../../scripts/acquire_all.lua")
    ))
});

impl RedisBackend {
    /// Grants every request in one script, or none: [`LockBackend::try_acquire_all`].
    ///
    /// With replica confirmation on, the grant goes through the same `WAIT` as a single
    /// acquire's, on the connection that carried the script: a set the replicas do not
    /// confirm in time is released again, every key of it (best effort: a key whose
    /// release fails too expires with its TTL), and the attempt fails as
    /// [`ErrorKind::Unavailable`].
    ///
    /// [`LockBackend::try_acquire_all`]: lock_core::backend::LockBackend::try_acquire_all
    pub(super) async fn acquire_all(
        &self,
        requests: &[AcquireRequest],
    ) -> Result<Option<Vec<Grant>>> {
        if let Some(request) = requests
            .iter()
            .find(|request| request.key().primitive() != Primitive::Mutex)
        {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "a lock set takes mutex keys only, not {:?}",
                    request.key().primitive().name()
                ),
            ));
        }
        if requests.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let inner = &self.inner;
        let mut script = ACQUIRE_ALL.prepare_invoke();
        for request in requests {
            script
                .key(inner.layout.lock_key(request.key()))
                .key(inner.layout.fence_key(request.key()))
                .arg(request.lease_id().to_string())
                .arg(ttl_millis(request.store_ttl()))
                .arg(label_arg(request.holder_label()));
        }
        let pinned = inner.node.pin().await?;
        let tokens: Vec<u64> = pinned.invoke(&script, "acquire").await?;
        if tokens.is_empty() {
            return Ok(None);
        }
        if tokens.len() != requests.len() || tokens.contains(&0) {
            return Err(crate::error::unexpected_reply(
                "acquire",
                inner.node.shown(),
            ));
        }
        if let Some(confirmation) = &inner.confirmation {
            if let Err(unconfirmed) = confirmation.confirm(&pinned, "acquire").await {
                for request in requests {
                    if let Err(err) = self.release(request.key(), request.lease_id()).await {
                        tracing::warn!(
                            error = %err,
                            "could not roll back an unconfirmed grant; it expires with its TTL"
                        );
                    }
                }
                return Err(unconfirmed);
            }
        }
        Ok(Some(
            tokens
                .into_iter()
                .map(|token| FencingToken::new(token).into())
                .collect(),
        ))
    }
}
