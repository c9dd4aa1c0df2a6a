//! The single-node backend: each operation is one script on one server.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;

use lock_core::{
    async_trait,
    backend::{AcquireRequest, Grant, HolderInfo, KeyWatch, LeaseRenewal, Liveness, LockBackend},
    Capabilities, Error, ErrorKind, FencingToken, LeaseId, LockKey, Result,
};

use crate::config::RedisConfig;
use crate::error::unexpected_reply;
use crate::keys::Layout;
use crate::node::{Node, NodeOptions, ACQUIRE, INSPECT, RELEASE, RENEW_MANY};
use crate::notify::Notifier;

/// What both Redis backends promise: notification by pub/sub, batched renewal, millisecond
/// TTLs on the server's clock, fencing counters as durable as the operator says the server
/// is (and never durable on a server allowed to evict them). No fair ordering: waiters race.
pub(crate) fn capabilities(config: &RedisConfig) -> Capabilities {
    Capabilities {
        native_notification: true,
        durable_fencing: config.durable && !config.allow_eviction,
        reentrancy: true,
        liveness: Liveness::Batched,
        min_ttl: Duration::from_millis(10),
        max_ttl: Duration::from_secs(30 * 24 * 60 * 60),
        ttl_granularity: Duration::from_millis(1),
        ..Capabilities::default()
    }
}

/// How every node of `config` connects.
pub(crate) fn node_options(config: &RedisConfig) -> NodeOptions {
    NodeOptions {
        connect_timeout: config.connect_timeout,
        response_timeout: config.response_timeout,
        allow_eviction: config.allow_eviction,
    }
}

/// A TTL as the whole milliseconds the scripts pass to `PX`/`PEXPIRE`, rounded up.
pub(crate) fn ttl_millis(capabilities: &Capabilities, ttl: Duration) -> u64 {
    u64::try_from(capabilities.store_ttl(ttl).as_millis()).unwrap_or(u64::MAX)
}

/// Most leases one `renew_many.lua` call renews, so one script never holds the server up
/// for long; a larger batch goes as several calls, pipelined on the node's connection.
const RENEWALS_PER_SCRIPT: usize = 1000;

/// Renews `leases` on `node` with as few `renew_many.lua` calls as [`RENEWALS_PER_SCRIPT`]
/// allows, answering for each lease in order whether the node still held it.
pub(crate) async fn renew_entries(
    node: &Node,
    layout: &Layout,
    capabilities: &Capabilities,
    leases: &[LeaseRenewal],
) -> Result<Vec<bool>> {
    let calls = leases.chunks(RENEWALS_PER_SCRIPT).map(|chunk| async move {
        let mut invocation = RENEW_MANY.prepare_invoke();
        for lease in chunk {
            invocation
                .key(layout.lock_key(&lease.key))
                .arg(lease.lease_id.to_string())
                .arg(ttl_millis(capabilities, lease.ttl));
        }
        let renewed: Vec<i64> = node.invoke(&invocation, "renew").await?;
        if renewed.len() != chunk.len() {
            return Err(unexpected_reply("renew", node.shown()));
        }
        Ok(renewed)
    });
    let replies = try_join_all(calls).await?;
    Ok(replies
        .into_iter()
        .flatten()
        .map(|renewed| renewed == 1)
        .collect())
}

/// A lock entry as the scripts store it: `<lease id>:<token>:<stamp>` (the stamp is 0 on a
/// single node, and the acquisition attempt under Redlock).
pub(crate) struct Entry {
    pub(crate) lease_id: LeaseId,
    pub(crate) token: u64,
}

impl Entry {
    pub(crate) fn parse(value: &str) -> Option<Entry> {
        let mut parts = value.split(':');
        let lease_id = parts.next()?.parse().ok()?;
        let token = parts.next()?.parse().ok()?;
        Some(Entry { lease_id, token })
    }
}

/// Reads `(entry, remaining TTL)` from an inspect script reply; `None` when free.
pub(crate) fn parse_inspect(reply: (String, i64)) -> Option<Option<(Entry, Duration)>> {
    let (value, pttl) = reply;
    if value.is_empty() {
        return Some(None);
    }
    let entry = Entry::parse(&value)?;
    // PTTL rounds down: 0 means under a millisecond left, and the entry is still live (a
    // renewal now would still find it), so it must not be reported free yet.
    Some(Some((
        entry,
        Duration::from_millis(pttl.max(0).unsigned_abs()),
    )))
}

/// Locks on one standalone Redis server (not a Redis Cluster: the batched renewal touches
/// keys of many hash slots at once, which a Cluster node refuses).
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
}

impl RedisBackend {
    /// Connects to the single node of `config` (a Redlock configuration is refused with
    /// [`ErrorKind::InvalidInput`]; use [`RedlockBackend`](crate::RedlockBackend)).
    ///
    /// The connection is made at once, so a wrong address or password fails here, as
    /// [`ErrorKind::Unavailable`] or [`ErrorKind::PermissionDenied`]; a server that may
    /// evict keys, or a database index it does not have, as [`ErrorKind::Misconfigured`].
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        config.validate()?;
        let targets = config.node_targets()?;
        let Ok([target]) = <[_; 1]>::try_from(targets) else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "RedisBackend takes exactly one node; use RedlockBackend for several",
            ));
        };
        let options = node_options(config);
        let node = Node::new(target, options)?;
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
                capabilities: capabilities(config),
            }),
        })
    }

    /// Keys starting with `key_prefix` that have a lock entry on the server (live leases;
    /// fencing counters are not listed). Uses `SCAN`, so it is safe on a busy server.
    pub async fn stored_keys(&self, key_prefix: &str) -> Result<Vec<String>> {
        let layout = &self.inner.layout;
        let found = self
            .inner
            .node
            .scan(&layout.scan_pattern(key_prefix))
            .await?;
        let mut keys: Vec<String> = found.iter().filter_map(|k| layout.user_key(k)).collect();
        keys.sort();
        Ok(keys)
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

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let inner = &self.inner;
        let token: u64 = inner
            .node
            .invoke(
                ACQUIRE
                    .key(inner.layout.lock_key(request.key()))
                    .key(inner.layout.fence_key(request.key()))
                    .arg(request.lease_id().to_string())
                    .arg(ttl_millis(&inner.capabilities, request.ttl())),
                "acquire",
            )
            .await?;
        Ok((token > 0).then(|| FencingToken::new(token).into()))
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool> {
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

    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<bool>> {
        let inner = &self.inner;
        match renew_entries(&inner.node, &inner.layout, &inner.capabilities, leases).await {
            Ok(renewed) => renewed.into_iter().map(Ok).collect(),
            Err(err) => vec![Err(err); leases.len()],
        }
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
        let inner = &self.inner;
        let released: i64 = inner
            .node
            .invoke(
                RELEASE
                    .key(inner.layout.lock_key(key))
                    .arg(lease_id.to_string())
                    .arg(inner.layout.channel()),
                "release",
            )
            .await?;
        Ok(released == 1)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        let inner = &self.inner;
        let reply: (String, i64) = inner
            .node
            .invoke(&INSPECT.key(inner.layout.lock_key(key)), "inspect")
            .await?;
        let parsed =
            parse_inspect(reply).ok_or_else(|| unexpected_reply("inspect", inner.node.shown()))?;
        Ok(parsed.map(|(entry, remaining_ttl)| HolderInfo {
            lease_id: entry.lease_id,
            token: FencingToken::new(entry.token),
            remaining_ttl,
            waiters: None,
            holder: None,
        }))
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        let inner = &self.inner;
        Ok(Some(inner.notifier.watch(inner.layout.lock_key(key))))
    }
}
