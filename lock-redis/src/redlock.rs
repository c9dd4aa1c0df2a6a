//! Redlock: a lock held on a majority of independent Redis nodes, with a fencing token
//! that grows across quorum acquisitions whose majorities differ.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lock_core::backend::async_trait;
use lock_core::backend::{
    finish_if_dropped, unanswered, with_timeout, AcquireRequest, Grant, HolderInfo, KeyWatch,
    LeaseRenewal, LockBackend, Ownership,
};
use lock_core::{Backoff, Capabilities, Error, ErrorKind, FencingToken, LeaseId, LockKey, Result};

use redis::Script;

use crate::config::RedisConfig;
use crate::entry::{label_arg, read_holder, release_if_owner, renew_if_owner, ttl_millis};
use crate::keys::Layout;
use crate::node::{Node, NodeOptions};
use crate::notify::Notifier;
use crate::quorum::Quorum;

static RESERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/reserve.lua")));
static CONFIRM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/confirm.lua")));
static DISCARD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/discard.lua")));

/// Locks held on a majority of N independent Redis nodes (the Redlock algorithm), with a
/// fencing token that is strictly increasing even when successive majorities differ.
///
/// Every operation goes to all nodes at once, each bounded by `node_timeout`. An acquisition
/// succeeds only when a majority granted it and the lease is still valid after subtracting
/// the elapsed time and the clock-drift allowance; otherwise whatever was taken is released.
/// Renewal needs a majority; release goes everywhere. Read the crate docs for what Redlock
/// does and does not guarantee.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    quorum: Quorum,
    layout: Layout,
    notifier: Notifier,
    node_timeout: Duration,
    capabilities: Capabilities,
}

/// Round-1 reply of one node.
struct Reserved {
    node: usize,
    status: i64,
    token: u64,
}

/// One acquisition attempt as the scripts take it.
struct Attempt {
    key: LockKey,
    lease_id: LeaseId,
    ttl: Duration,
    lock_key: String,
    fence_key: String,
    lease: String,
    label: String,
    ttl_ms: u64,
    /// Scopes the attempt's clean-up to it (see reserve.lua and discard.lua).
    stamp: u64,
}

impl Attempt {
    fn of(inner: &Inner, request: &AcquireRequest) -> Self {
        Attempt {
            key: request.key().clone(),
            lease_id: request.lease_id(),
            ttl: request.ttl(),
            lock_key: inner.layout.lock_key(request.key()),
            fence_key: inner.layout.fence_key(request.key()),
            lease: request.lease_id().to_string(),
            label: label_arg(request.holder_label()),
            ttl_ms: ttl_millis(request.store_ttl()),
            stamp: next_stamp(),
        }
    }
}

/// What round 1 found on the nodes that answered.
#[derive(Default)]
struct RoundOne {
    /// The nodes that reserved the key for this attempt.
    reserved: Vec<Reserved>,
    /// How many nodes found the key held by another lease.
    held: usize,
    /// The highest fencing counter any node reported.
    counter_max: u64,
}

impl RoundOne {
    /// The token of the grant: a retry that finds this lease's confirmed token on a
    /// majority, and no higher counter anywhere, keeps it; anything else gets a token
    /// above every counter of the majority, which is above every token granted before
    /// (docs.md).
    fn choose_token(&self, quorum: Quorum) -> u64 {
        let highest = self.reserved.iter().map(|r| r.token).max().unwrap_or(0);
        let confirmed_before = self
            .reserved
            .iter()
            .filter(|r| r.status == OWN && r.token == highest)
            .count();
        if highest > 0 && quorum.reached(confirmed_before) && self.counter_max <= highest {
            highest
        } else {
            self.counter_max.max(highest) + 1
        }
    }
}

/// How round 1 ended.
enum Reservation {
    /// A majority reserved the key.
    Taken(RoundOne),
    /// A majority is held by other leases: the key is taken.
    Held,
    /// Too few nodes answered to tell.
    Failed(Error),
}

/// Stamps of acquisition attempts, growing across every attempt this process makes: a
/// lease's attempts are made one after another by one client, so a later attempt always
/// carries a larger stamp (see reserve.lua and discard.lua for what that protects).
static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

/// Pauses between tries of a clean-up on a node that did not answer.
const CLEAN_UP_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(1),
};
/// How long a clean-up keeps trying a silent node: long enough to outlast a brief partition
/// or a failover, short enough that a dead node does not keep tasks (and the client they
/// hold) alive for a long TTL.
const CLEAN_UP_PERSISTENCE: Duration = Duration::from_secs(60);

fn next_stamp() -> u64 {
    ATTEMPTS.fetch_add(1, Ordering::Relaxed) + 1
}

/// Why Redlock keeps no semaphores or reader-writer locks (docs.md, "Redlock keeps no
/// semaphores or reader-writer locks"); said in the error that refuses one. The bound is
/// the pigeonhole's: N nodes granting at most L permits each give N x L grants, a permit
/// takes M of them, and blocks of M consecutive nodes (cyclically) reach it.
pub(crate) const SHARED_HOLDS_REFUSAL: &str =
    "a majority of independent nodes cannot keep a count of holders: each node counts only \
     the permits granted on it, and two majorities may share a single node, so with N nodes, \
     majorities of M and a limit of L, up to floor(N*L/M) permits can each hold a majority \
     while no node grants more than L: more than L holders once L >= 2 on 3 or 5 nodes \
     (5 nodes, limit 2: three permits, on nodes 1-2-3, 4-5-1 and 2-3-4); reader-writer \
     locks are refused with them (one capability, shared_holds)";

/// Round-1 statuses (see reserve.lua).
const HELD: i64 = 0;
const OWN: i64 = 2;

impl RedlockBackend {
    /// Prepares clients for every node of `config` and connects to them concurrently.
    ///
    /// Fails only when a majority cannot be reached (with the first such error, e.g.
    /// [`ErrorKind::Unavailable`] or [`ErrorKind::PermissionDenied`]); the other nodes are
    /// connected lazily when they come back. Outside a Tokio runtime it is
    /// [`ErrorKind::InvalidInput`].
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        lock_core::backend::require_runtime("redis")?;
        config.validate()?;
        let options = NodeOptions::new(config);
        let nodes = config
            .node_targets()?
            .into_iter()
            .map(|target| Node::new(target, options))
            .collect::<Result<Vec<Node>>>()?;
        let quorum = Quorum::of(nodes.len());
        let layout = Layout::new(&config.key_prefix);
        let subscribers: Vec<&Node> = nodes.iter().collect();
        // Every node that held the lease publishes its release, within about a reply time
        // of each other.
        let notifier = Notifier::start(
            &subscribers,
            layout.channel(),
            config.connect_timeout,
            quorum.needed(),
            config.response_timeout,
        );
        let backend = RedlockBackend {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                layout,
                notifier,
                node_timeout: config.node_timeout,
                // No idempotency records (`records: false`): a write fenced by the lock is
                // not one atomic step across independent nodes (docs.md, "Idempotency
                // records"). No shared holds either (`shared_holds: false`).
                capabilities: Capabilities {
                    shared_holds_refusal: Some(SHARED_HOLDS_REFUSAL),
                    ..config.capabilities()
                },
            }),
        };
        let (connected, ()) = tokio::join!(
            join_all(
                backend
                    .inner
                    .nodes
                    .iter()
                    .map(|node| async move { node.connection().await.map(|_| ()) }),
            ),
            backend.inner.notifier.settled(),
        );
        let failures: Vec<Error> = connected.into_iter().filter_map(|r| r.err()).collect();
        // A node set up wrongly is refused even when a majority works without it: it
        // would silently weaken every lock.
        if let Some(misconfigured) = failures
            .iter()
            .find(|e| e.kind() == ErrorKind::Misconfigured)
        {
            return Err(misconfigured.clone());
        }
        if !quorum.reached(backend.inner.nodes.len() - failures.len()) {
            if let Some(first) = failures.into_iter().next() {
                return Err(first);
            }
        }
        Ok(backend)
    }

    /// How many nodes make a majority.
    pub fn quorum(&self) -> usize {
        self.inner.quorum.needed()
    }

    /// Every node's `SCAN` of the lock entries of keys starting with `key_prefix`.
    async fn scan_all(&self, key_prefix: &str) -> Vec<Result<Vec<String>>> {
        let pattern = self.inner.layout.scan_pattern(key_prefix);
        self.on_all("scan", |_, node| node.scan(&pattern)).await
    }

    /// The user keys of the lock entries `found`, sorted, each once.
    fn user_keys(&self, found: impl IntoIterator<Item = Vec<String>>) -> Vec<String> {
        let layout = &self.inner.layout;
        let mut keys: Vec<String> = found
            .into_iter()
            .flatten()
            .filter_map(|k| layout.user_key(&k))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Runs `operation` (`what`, for messages) on every node concurrently, each bounded by
    /// the node time-out.
    async fn on_all<'a, T, F, Fut>(&'a self, what: &str, operation: F) -> Vec<Result<T>>
    where
        F: Fn(usize, &'a Node) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let timeout = self.inner.node_timeout;
        join_all(self.inner.nodes.iter().enumerate().map(|(index, node)| {
            let pending = operation(index, node);
            let store = format!("redis {}", node.shown());
            async move { with_timeout(&store, timeout, what, pending).await }
        }))
        .await
    }

    /// Round 1 of an acquisition: takes the key (token pending) on every node that has it
    /// free, and reads every node's counter. Without a majority, whatever was taken is
    /// given back before answering.
    async fn reserve(&self, attempt: &Attempt) -> Reservation {
        let replies = self
            .on_all("reserve", |_, node| {
                let Attempt {
                    lock_key,
                    fence_key,
                    lease,
                    label,
                    ttl_ms,
                    stamp,
                    ..
                } = attempt;
                async move {
                    node.invoke::<(i64, u64, u64)>(
                        RESERVE
                            .key(lock_key)
                            .key(fence_key)
                            .arg(lease)
                            .arg(ttl_ms)
                            .arg(stamp)
                            .arg(label),
                        "reserve",
                    )
                    .await
                }
            })
            .await;
        let mut round_one = RoundOne::default();
        let mut errors = Vec::new();
        for (node, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok((status, _, counter)) if status == HELD => {
                    round_one.held += 1;
                    round_one.counter_max = round_one.counter_max.max(counter);
                }
                Ok((status, token, counter)) => {
                    round_one.counter_max = round_one.counter_max.max(counter);
                    round_one.reserved.push(Reserved {
                        node,
                        status,
                        token,
                    });
                }
                Err(err) => errors.push(err),
            }
        }
        let (quorum, taken) = (self.inner.quorum, round_one.reserved.len());
        if quorum.reached(taken) {
            return Reservation::Taken(round_one);
        }
        if taken > 0 {
            self.abandon(&attempt.key, attempt.lease_id, attempt.stamp, attempt.ttl)
                .await;
        }
        if quorum.reached(taken + round_one.held) {
            Reservation::Held
        } else {
            Reservation::Failed(quorum.missed("acquire", taken + round_one.held, errors))
        }
    }

    /// Round 2 of an acquisition: records `token` in each reserved entry and raises each
    /// reserved node's counter to it. Answers how many nodes confirmed.
    async fn confirm(&self, attempt: &Attempt, round_one: &RoundOne, token: u64) -> usize {
        let reserved: HashSet<usize> = round_one.reserved.iter().map(|r| r.node).collect();
        let confirmed = self
            .on_all("confirm", |index, node| {
                let reserved = reserved.contains(&index);
                let (lock_key, fence_key, lease, stamp) = (
                    &attempt.lock_key,
                    &attempt.fence_key,
                    &attempt.lease,
                    attempt.stamp,
                );
                async move {
                    if !reserved {
                        return Ok(0);
                    }
                    node.invoke::<i64>(
                        CONFIRM
                            .key(lock_key)
                            .key(fence_key)
                            .arg(lease)
                            .arg(stamp)
                            .arg(token),
                        "confirm",
                    )
                    .await
                }
            })
            .await;
        confirmed.iter().filter(|r| matches!(r, Ok(1))).count()
    }

    /// Removes what the failed attempt `stamp` of `lease_id` took, from every node.
    ///
    /// The clean-up finishes in the background if it outlasts the wait for it
    /// ([`finish_if_dropped`]), and retries a node that does not answer
    /// until the entry would have expired anyway (`ttl`, at most [`CLEAN_UP_PERSISTENCE`]),
    /// so neither a caller that stops waiting (after the node time-out, or by dropping the
    /// attempt) nor a brief partition leaves pending entries on a minority for a whole
    /// TTL. It may therefore land after a later attempt of the same lease has succeeded,
    /// which is why it is scoped to this attempt (discard.lua), and it tells no waiter:
    /// nothing was ever held.
    async fn abandon(&self, key: &LockKey, lease_id: LeaseId, stamp: u64, ttl: Duration) {
        let inner = Arc::clone(&self.inner);
        let (lock_key, lease) = (inner.layout.lock_key(key), lease_id.to_string());
        let until = Instant::now() + ttl.min(CLEAN_UP_PERSISTENCE);
        let clean_up = finish_if_dropped(async move {
            join_all(inner.nodes.iter().map(|node| {
                let (lock_key, lease) = (&lock_key, &lease);
                // Whatever the outcome, nothing is left to do: a node that never answered
                // lets the entry expire with its TTL.
                CLEAN_UP_BACKOFF.retry_until(Some(until), unanswered, move || {
                    let mut discard = DISCARD.prepare_invoke();
                    discard.key(lock_key).arg(lease).arg(stamp);
                    async move { node.invoke::<i64>(&discard, "clean up").await }
                })
            }))
            .await;
        });
        // Usually done well within the node time-out; a rival that looks next then finds
        // the nodes free.
        let _ = tokio::time::timeout(self.inner.node_timeout, clean_up).await;
    }
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<&str> = self.inner.nodes.iter().map(|node| node.shown()).collect();
        f.debug_struct("RedlockBackend")
            .field("nodes", &nodes)
            .field("layout", &self.inner.layout)
            .field("node_timeout", &self.inner.node_timeout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let started = Instant::now();
        let attempt = Attempt::of(&self.inner, request);
        let round_one = match self.reserve(&attempt).await {
            Reservation::Taken(round_one) => round_one,
            Reservation::Held => return Ok(None),
            Reservation::Failed(err) => return Err(err),
        };
        let token = round_one.choose_token(self.inner.quorum);
        let confirmations = self.confirm(&attempt, &round_one, token).await;
        let still_valid = request
            .grant(FencingToken::new(token), started)
            .valid_until()
            > Instant::now();
        if self.inner.quorum.reached(confirmations) && still_valid {
            return Ok(Some(FencingToken::new(token).into()));
        }
        self.abandon(
            request.key(),
            request.lease_id(),
            attempt.stamp,
            request.ttl(),
        )
        .await;
        let why = if still_valid {
            format!(
                "acquire: the token was recorded on only {confirmations} of {} Redis nodes",
                self.inner.nodes.len()
            )
        } else {
            format!(
                "acquire: a majority answered only after the lease's validity ({:?} minus drift) ran out",
                request.ttl()
            )
        };
        Err(Error::new(ErrorKind::Unavailable, why))
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let lease = LeaseRenewal {
            key: key.clone(),
            lease_id,
            ttl,
        };
        let mut renewed = self.renew_many(std::slice::from_ref(&lease)).await;
        renewed.pop().unwrap_or_else(|| {
            Err(Error::new(
                ErrorKind::Internal,
                "renew: no answer for the lease",
            ))
        })
    }

    /// One batch per node for all the leases, then a majority per lease. The validity of a
    /// renewal is judged by the core from when the batch was sent (send time + TTL −
    /// drift), as for acquisition, so a majority that answers late renews nothing usable.
    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        let inner = &self.inner;
        let replies = self
            .on_all("renew", |_, node| {
                renew_if_owner(node, &inner.layout, leases)
            })
            .await;
        (0..leases.len())
            .map(|index| {
                let answers = replies.iter().map(|reply| match reply {
                    Ok(renewed) => Ok(renewed.get(index).copied().unwrap_or(Ownership::NotHeld)),
                    Err(err) => Err(err.clone()),
                });
                inner.quorum.decide("renew", answers)
            })
            .collect()
    }

    /// Goes to every node, so a minority of leftovers is removed too; but the lease was
    /// live, and is released, only if a majority still held it.
    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        let inner = &self.inner;
        let (lock_key, channel) = (inner.layout.lock_key(key), inner.layout.channel());
        let replies = self
            .on_all("release", |_, node| {
                release_if_owner(node, &lock_key, lease_id, &channel)
            })
            .await;
        inner.quorum.decide("release", replies)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        let inner = &self.inner;
        let lock_key = inner.layout.lock_key(key);
        let replies = self
            .on_all("inspect", |_, node| read_holder(node, &lock_key))
            .await;
        let held = inner.quorum.holder("inspect", replies)?;
        Ok(held.map(|held| held.into_info()))
    }

    /// Keys starting with `key_prefix` that have a lock entry on any node (fencing
    /// counters are not listed). Unreachable nodes are skipped.
    async fn stored_keys(&self, key_prefix: &str) -> Result<Vec<String>> {
        let found = self.scan_all(key_prefix).await;
        Ok(self.user_keys(found.into_iter().flatten()))
    }

    /// The candidates are the keys with an entry on any node; a majority of nodes must
    /// have been scanned, so every key a majority holds is among them (the majorities
    /// overlap). Each candidate then counts as held only as `inspect` decides: where a
    /// majority agrees on one lease.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let quorum = self.inner.quorum;
        let mut scanned = Vec::new();
        let mut errors = Vec::new();
        for reply in self.scan_all(prefix).await {
            match reply {
                Ok(found) => scanned.push(found),
                Err(err) => errors.push(err),
            }
        }
        if !quorum.reached(scanned.len()) {
            return Err(quorum.missed("list_held", scanned.len(), errors));
        }
        let mut held = Vec::new();
        for key in self.user_keys(scanned) {
            if held.len() == limit {
                break;
            }
            let key = LockKey::new(key)?;
            if let Some(info) = self.inspect(&key).await? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        let inner = &self.inner;
        Ok(Some(inner.notifier.watch(inner.layout.lock_key(key))))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use conformance_tests::store_process::{StoreProcess, StoreSpec};
    use lock_core::backend::default_drift_allowance;
    use lock_core::Renewal;

    use super::*;

    /// Sets (or with `None` deletes) `key` on the server at `addr`, behind the backend's back.
    async fn set(addr: std::net::SocketAddr, key: &str, value: Option<&str>) {
        let mut raw = redis::Client::open(format!("redis://{addr}/0"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let cmd = match value {
            Some(value) => redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("PX")
                .arg(30_000)
                .clone(),
            None => redis::cmd("DEL").arg(key).clone(),
        };
        let _: redis::Value = cmd.query_async(&mut raw).await.unwrap();
    }

    /// S2: an attempt of lease L fails and its clean-up is held up on the way; the next
    /// attempt of L succeeds on exactly a majority (A, B, C); then the first attempt's
    /// clean-up lands. It must not remove the successful attempt's entries, or a rival
    /// would form a majority (A, B, D or E) while L's holder believes it holds the key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_clean_up_of_an_earlier_attempt_spares_the_later_grant() {
        let mut servers = Vec::new();
        for _ in 0..5 {
            servers.push(StoreProcess::start(StoreSpec::redis()).await.unwrap());
        }
        let hosts: Vec<String> = servers.iter().map(|s| s.addr().to_string()).collect();
        let config = RedisConfig::from_url(&format!(
            "redis+redlock://{}/0?key_prefix=late-clean-up:",
            hosts.join(",")
        ))
        .unwrap();
        let holder = RedlockBackend::connect(&config).await.unwrap();
        let rival = RedlockBackend::connect(&config).await.unwrap();
        let key = LockKey::new(format!("k{:08x}", fastrand::u32(..))).unwrap();
        let ttl = Duration::from_secs(30);
        let request = AcquireRequest::new(
            key.clone(),
            ttl,
            default_drift_allowance(ttl),
            Renewal::Manual,
        );
        let lock_key = holder.inner.layout.lock_key(&key);

        // The earlier attempt: it failed, and its clean-up is still on its way.
        let earlier = next_stamp();
        // Someone else holds D and E while the next attempt runs, so it wins A, B, C only.
        let foreign = format!("{}:7:1", "f".repeat(32));
        for server in &servers[3..] {
            set(server.addr(), &lock_key, Some(&foreign)).await;
        }
        assert!(holder.try_acquire(&request).await.unwrap().is_some());
        for server in &servers[3..] {
            set(server.addr(), &lock_key, None).await;
        }

        holder.abandon(&key, request.lease_id(), earlier, ttl).await;

        let challenger = AcquireRequest::new(
            key.clone(),
            ttl,
            default_drift_allowance(ttl),
            Renewal::Manual,
        );
        assert!(
            rival.try_acquire(&challenger).await.unwrap().is_none(),
            "a rival formed a majority while the lease was held"
        );
        let held = holder
            .inspect(&key)
            .await
            .unwrap()
            .expect("the lock is gone");
        assert_eq!(held.lease_id, request.lease_id());
        assert_eq!(
            holder.release(&key, request.lease_id()).await.unwrap(),
            Ownership::Held
        );
    }
}
