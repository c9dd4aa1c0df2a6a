//! The single-node backend: each operation is one script on one server.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lock_core::backend::async_trait;
use lock_core::backend::{
    AcquireRequest, Grant, HolderInfo, KeyWatch, LeaseRenewal, LockBackend, Ownership, Record,
};
use lock_core::{Capabilities, Error, ErrorKind, FencingToken, LeaseId, LockKey, Result};
use redis::Script;

use crate::config::RedisConfig;
use crate::entry::{label_arg, read_holder, release_if_owner, renew_if_owner_on, ttl_millis};
use crate::error::unexpected_reply;
use crate::keys::Layout;
use crate::node::{Node, NodeOptions};
use crate::notify::Notifier;
use crate::replicas::Confirmation;
use crate::sentinel::Sentinels;
use crate::shared;

mod sets;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/token.lua"),
        include_str!("../scripts/grant.lua"),
        include_str!("../scripts/acquire.lua")
    ))
});
static WRITE_RECORD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/write_record.lua")));

/// Locks on one standalone Redis server, or on the primary Redis Sentinel names, followed
/// across failovers (not a Redis Cluster: the batched renewal touches keys of many hash
/// slots at once, which a Cluster node refuses).
///
/// Acquire, renew, release and inspect are each one Lua script run by hash, so every
/// decision is atomic on the server and judged by the server's clock. Cloning is cheap and
/// clones share the connection and the release subscription. See the crate docs for the
/// guarantees and their limits.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    node: Node,
    layout: Layout,
    notifier: Notifier,
    capabilities: Capabilities,
    /// Replicas that must have each grant, renewal and record write before it counts.
    confirmation: Option<Confirmation>,
}

impl RedisBackend {
    /// Connects to the single node of `config`, or behind Sentinel to the primary the
    /// sentinels name (a Redlock configuration is refused with [`ErrorKind::InvalidInput`];
    /// use [`RedlockBackend`](crate::RedlockBackend)).
    ///
    /// The connection is made at once, so a wrong address or password fails here, as
    /// [`ErrorKind::Unavailable`] or [`ErrorKind::PermissionDenied`]; a server that may
    /// evict keys, or a database index it does not have, as [`ErrorKind::Misconfigured`].
    /// Outside a Tokio runtime it is [`ErrorKind::InvalidInput`].
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        lock_core::backend::require_runtime("redis")?;
        config.validate()?;
        let options = NodeOptions::new(config);
        let node = match Sentinels::of(config)? {
            Some(sentinels) => Node::behind(sentinels, options),
            None => {
                let targets = config.node_targets()?;
                let Ok([target]) = <[_; 1]>::try_from(targets) else {
                    return Err(Error::new(
                        ErrorKind::InvalidInput,
                        "RedisBackend takes exactly one node; use RedlockBackend for several",
                    ));
                };
                Node::new(target, options)?
            }
        };
        let subscriber = match config.subscriber_target()? {
            Some(target) => Some(Node::new(target, options)?),
            None => None,
        };
        let layout = Layout::new(&config.key_prefix);
        // One server publishes each release once: every message is news.
        let notifier = Notifier::start(
            &[subscriber.as_ref().unwrap_or(&node)],
            layout.channel(),
            config.connect_timeout,
            1,
            Duration::ZERO,
        );
        let (connected, ()) = tokio::join!(node.connection(), notifier.settled());
        connected?;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                node,
                layout,
                notifier,
                capabilities: Capabilities {
                    // Records sit beside the lock entry and are written by a script that
                    // checks it (the Redlock backend keeps none: see docs.md).
                    records: true,
                    // Semaphores and reader-writer locks: counted and decided by one
                    // script on one server (`shared.rs`).
                    shared_holds: true,
                    // One script takes a whole set (backend/sets.rs).
                    atomic_sets: true,
                    ..config.capabilities()
                },
                confirmation: Confirmation::of(config),
            }),
        })
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("node", &self.inner.node.shown())
            .field("layout", &self.inner.layout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// With replica confirmation on, a grant the replicas do not confirm in time is
    /// released again (best effort: if that fails too, the entry expires with its TTL) and
    /// the attempt fails as [`ErrorKind::Unavailable`], so no unconfirmed guard exists.
    /// Mutex and shared holds alike.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let inner = &self.inner;
        let pinned = inner.node.pin().await?;
        let granted = match inner.layout.shared_keys(request.key()) {
            Some(keys) => shared::acquire(&pinned, &keys, request).await?,
            None => {
                let token: u64 = pinned
                    .invoke(
                        ACQUIRE
                            .key(inner.layout.lock_key(request.key()))
                            .key(inner.layout.fence_key(request.key()))
                            .arg(request.lease_id().to_string())
                            .arg(ttl_millis(request.store_ttl()))
                            .arg(label_arg(request.holder_label())),
                        "acquire",
                    )
                    .await?;
                (token != 0).then_some(token)
            }
        };
        // A refused writer's intent is not confirmed: losing it in a failover only lets
        // readers in ahead of the writer.
        let Some(token) = granted else {
            return Ok(None);
        };
        if let Some(confirmation) = &inner.confirmation {
            if let Err(unconfirmed) = confirmation.confirm(&pinned, "acquire").await {
                if let Err(err) = self.release(request.key(), request.lease_id()).await {
                    tracing::warn!(
                        error = %err,
                        "could not roll back an unconfirmed grant; it expires with its TTL"
                    );
                }
                return Err(unconfirmed);
            }
        }
        Ok(Some(FencingToken::new(token).into()))
    }

    /// As [`try_acquire`](Self::try_acquire), for every key of the set: with replica
    /// confirmation on, an unconfirmed set is released again, every key of it.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<Option<Vec<Grant>>> {
        self.acquire_all(requests).await
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let lease = LeaseRenewal {
            key: key.clone(),
            lease_id,
            ttl,
        };
        let mut renewed = self.renew_many(std::slice::from_ref(&lease)).await;
        renewed
            .pop()
            .unwrap_or_else(|| Err(unexpected_reply("renew", self.inner.node.shown())))
    }

    /// With replica confirmation on, a batch the replicas do not confirm in time fails as
    /// a whole ([`ErrorKind::Unavailable`]): an unconfirmed extension is no proof, so no
    /// lease's deadline moves (the primary keeps the longer TTL, which only delays a rival).
    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        let inner = &self.inner;
        let renewed = async {
            let pinned = inner.node.pin().await?;
            let renewed = renew_if_owner_on(&pinned, &inner.layout, leases).await?;
            if let Some(confirmation) = &inner.confirmation {
                confirmation.confirm(&pinned, "renew").await?;
            }
            Ok(renewed)
        };
        match renewed.await {
            Ok(renewed) => renewed.into_iter().map(Ok).collect(),
            Err(err) => vec![Err(err); leases.len()],
        }
    }

    /// A shared hold's release also removes the lease's writer intent (answering
    /// [`Ownership::NotHeld`] when only the intent was there), and wakes the waiters then
    /// too: the readers the intent held back may go in.
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        let inner = &self.inner;
        let channel = inner.layout.channel();
        match inner.layout.shared_keys(key) {
            Some(keys) => shared::release(&inner.node, &keys, lease_id, &channel).await,
            None => {
                let lock_key = inner.layout.lock_key(key);
                release_if_owner(&inner.node, &lock_key, lease_id, &channel).await
            }
        }
    }

    /// A shared key's oldest holder (lowest token).
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        let inner = &self.inner;
        if let Some(keys) = inner.layout.shared_keys(key) {
            return Ok(shared::holders(&inner.node, &keys)
                .await?
                .into_iter()
                .next());
        }
        let held = read_holder(&inner.node, &inner.layout.lock_key(key)).await?;
        Ok(held.map(|held| held.into_info()))
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        let inner = &self.inner;
        match inner.layout.shared_keys(key) {
            Some(keys) => shared::holders(&inner.node, &keys).await,
            None => Ok(self.inspect(key).await?.into_iter().collect()),
        }
    }

    /// Keys starting with `key_prefix` that have a lock entry on the server, or a
    /// semaphore's or reader-writer lock's holders or writer intents (live ones, and
    /// expired ones Redis has not deleted yet; fencing counters and records are not
    /// listed). Uses `SCAN`, so it is safe on a busy server.
    async fn stored_keys(&self, key_prefix: &str) -> Result<Vec<String>> {
        let layout = &self.inner.layout;
        let found = self
            .inner
            .node
            .scan(&layout.scan_pattern(key_prefix))
            .await?;
        let mut keys: Vec<String> = found
            .iter()
            .filter_map(|k| layout.stored_user_key(k))
            .collect();
        keys.sort();
        // SCAN may return a key more than once.
        keys.dedup();
        Ok(keys)
    }

    /// `SCAN`s the lock entries under the prefix (hex-encoded, so the pattern needs no
    /// escaping whatever the prefix holds), then reads each holder in key order as
    /// `inspect` does, skipping entries that expired meanwhile (and keys that only a
    /// semaphore or reader-writer lock holds: the core lists mutexes alone).
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let inner = &self.inner;
        let mut held = Vec::new();
        for key in self.stored_keys(prefix).await? {
            if held.len() == limit {
                break;
            }
            let key = LockKey::new(key)?;
            if let Some(info) = read_holder(&inner.node, &inner.layout.lock_key(&key)).await? {
                held.push((key, info.into_info()));
            }
        }
        Ok(held)
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        let inner = &self.inner;
        Ok(Some(inner.notifier.watch(inner.layout.released_name(key))))
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        let node = &self.inner.node;
        let stored: Option<Vec<u8>> = node
            .query(
                redis::cmd("GET").arg(self.inner.layout.record_key(key)),
                "read_record",
            )
            .await?;
        stored
            .map(|bytes| {
                Record::from_bytes(&bytes)
                    .ok_or_else(|| unexpected_reply("read_record", node.shown()))
            })
            .transpose()
    }

    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        let retention_ms = Record::retention_millis(retention)?;
        let inner = &self.inner;
        let pinned = inner.node.pin().await?;
        let written: i64 = pinned
            .invoke(
                WRITE_RECORD
                    .key(inner.layout.lock_key(key))
                    .key(inner.layout.record_key(key))
                    .arg(lease_id.to_string())
                    .arg(record.to_bytes())
                    .arg(u64::try_from(retention_ms).unwrap_or(u64::MAX)),
                "write_record",
            )
            .await?;
        // A record that was not written (the lease is gone) has nothing to confirm.
        if let (1, Some(confirmation)) = (written, &inner.confirmation) {
            confirmation.confirm(&pinned, "write_record").await?;
        }
        Ok(Ownership::held_if(written == 1))
    }
}
