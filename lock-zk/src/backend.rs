//! The ZooKeeper backend: the queue recipe on the client's primitives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_core::backend::async_trait;
use lock_core::backend::{
    lock_unpoisoned as lock, unanswered, with_timeout, AcquireRequest, Grant, HolderInfo, KeyWatch,
    LockBackend, Ownership, Record, SessionKeeper, Turn,
};
use lock_core::{
    Capabilities, Error, ErrorKind, FencingToken, HoldKind, LeaseId, Liveness, LockKey, Primitive,
    Renewal, Result,
};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

use crate::config::ZkConfig;
use crate::detached::{held_for, with_ttl};
use crate::error::into_error;
use crate::keys::Layout;
use crate::keys::{contenders, decode_key, Contender};
use crate::records::{catch_up, Records};
use crate::session::{connect, Sessions, ZkSession};
use crate::shared::{self, key_of_parent, node_prefix, Rank};
use crate::watch::{Ahead, TurnWatch};

/// Fair, session-bound locks in ZooKeeper.
///
/// Clones share one client: its control session (lookups, releases of leases it does not
/// know), its lease sessions and its record of the nodes it created. See the crate docs for
/// the recipe, the TTL-to-session mapping and the fencing token.
#[derive(Clone, Debug)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ZkConfig,
    control: Client,
    sessions: Sessions,
    capabilities: Capabilities,
    acls: Acls<'static>,
    /// Idempotency records, beside the lock queues.
    records: Records,
    /// The nodes this client created, by lease id.
    own: Mutex<HashMap<LeaseId, Own>>,
    /// Lease ids whose node creation got no answer, with the session it was sent in: the
    /// node may exist, and is looked for by its name before another is created (Curator's
    /// protected mode), or when the lease is given up. The look goes through that session,
    /// whose requests the server handles in order, so it cannot miss a creation still on
    /// its way.
    uncertain: Mutex<HashMap<LeaseId, Arc<ZkSession>>>,
}

/// A node this client created.
#[derive(Clone, Debug)]
struct Own {
    parent: String,
    name: String,
    czxid: i64,
    session: Arc<ZkSession>,
    /// A lease renewed by hand follows a keeper of its own, which only its own requests
    /// move, so it ends by its own TTL whatever keeps the shared session alive.
    manual: Option<Arc<SessionKeeper>>,
    /// What the latest look at the queue saw ahead of this node, shared with its turn watch.
    ahead: Arc<Ahead>,
    granted: bool,
    /// The node's key, which says how it holds it.
    key: LockKey,
    /// A shared hold's token, once its grant was written (see [`ZkBackend::claim`]).
    claimed: Option<FencingToken>,
    /// A detached hold's node: a TTL node, which no session keeps or ends.
    detached: bool,
    /// The node's data as created (its TTL and holder label).
    data: Arc<[u8]>,
    /// The server's time of the node's creation (its `mtime` then), in ms.
    created: i64,
}

impl Own {
    fn path(&self) -> String {
        format!("{}/{}", self.parent, self.name)
    }

    /// A request about this node, sent at `sent_at`, was answered in its session. Nothing
    /// keeps a detached hold: its deadline stays where its creation set it.
    fn proved(&self, sent_at: Instant) {
        if self.detached {
            return;
        }
        self.session.proved(sent_at);
        if let Some(keeper) = &self.manual {
            keeper.kept_alive(sent_at);
        }
    }

    /// The keeper whose status the lease follows.
    fn keeper(&self) -> &SessionKeeper {
        self.manual.as_deref().unwrap_or(&self.session.keeper)
    }
}

/// Where a node stands in its key's queue.
enum Place {
    /// Its turn has come: first for a mutex, by the rank rules for a shared hold.
    First,
    Behind,
    Gone,
    /// The request is refused (a semaphore's limit that disagrees): its node must go.
    Refused(Error),
}

impl ZkBackend {
    /// Connects the control session of `config` and makes sure the lock root exists.
    ///
    /// An unreachable ensemble is [`ErrorKind::Unavailable`] within the connect timeout; a
    /// credential the server refuses for the root is [`ErrorKind::PermissionDenied`].
    /// Outside a Tokio runtime it is [`ErrorKind::InvalidInput`].
    pub async fn connect(config: &ZkConfig) -> Result<Self> {
        lock_core::backend::require_runtime("zookeeper")?;
        config.validate()?;
        let control = connect(config, config.session_timeout).await?;
        let acls = if config.credentials().is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        };
        if config.layout == Layout::Distlock {
            match control
                .mkdir(&config.root, &CreateMode::Persistent.with_acls(acls))
                .await
            {
                Ok(()) => {}
                Err(ZkError::NoNode) => {
                    return Err(Error::misconfigured(
                        "zookeeper: the chroot in the URL does not exist; create it first",
                    ))
                }
                Err(err) => return Err(into_error(err, "creating the lock root")),
            }
            // Creating needs no read permission; every lookup does.
            control
                .list_children(&config.root)
                .await
                .map_err(|err| into_error(err, "reading the lock root"))?;
        }
        let records = Records::ttl_nodes_enabled(&control, &config.root, acls).await?;
        if !records {
            tracing::warn!(
                "zookeeper: the server refuses TTL nodes, so idempotent runs and once tickets \
                 are refused; start it with -Dzookeeper.extendedTypesEnabled=true to have them"
            );
        }
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                capabilities: Capabilities {
                    fair_ordering: true,
                    native_notification: true,
                    durable_fencing: true,
                    reentrancy: true,
                    records,
                    // A detached hold is a TTL node too.
                    detached_holds: records,
                    // Both ends of a hold's judgment are server times in whole ms.
                    clock_step: Duration::from_millis(1),
                    shared_holds: true,
                    records_hint: (!records).then_some(
                        "the ZooKeeper server refuses TTL nodes; start it with \
                         -Dzookeeper.extendedTypesEnabled=true",
                    ),
                    liveness: Liveness::Session,
                    min_ttl: config.min_ttl,
                    // A session's timeout is its leases' TTL plus one tick.
                    max_ttl: config.max_ttl.saturating_sub(config.tick()),
                    max_ttl_hint: Some(
                        "raise the server's maxSessionTimeout and set the URL's max_ttl_ms to it \
                         (the longest TTL is max_ttl_ms less tick_ms)",
                    ),
                    ..Capabilities::default()
                },
                sessions: Sessions::new(config.clone()),
                records: Records::new(control.clone(), config.root.clone(), acls),
                config: config.clone(),
                control,
                acls,
                own: Mutex::default(),
                uncertain: Mutex::default(),
            }),
        })
    }

    /// The parent of `key`'s nodes, in its primitive's namespace.
    fn parent(&self, key: &LockKey) -> Result<String> {
        let config = &self.inner.config;
        shared::parent(config.layout, &config.root, key)
    }

    /// The name prefix of `lease`'s node for `key` (see [`shared::node_prefix`]).
    fn prefix(&self, key: &LockKey, lease: LeaseId) -> String {
        node_prefix(self.inner.config.layout, key.kind(), lease)
    }

    fn known(&self, lease: LeaseId) -> Option<Own> {
        lock(&self.inner.own).get(&lease).cloned()
    }

    fn forget(&self, lease: LeaseId) {
        self.inner.forget(lease, None);
    }

    /// The node of `request`: the one this client knows, the one an unanswered creation
    /// left, or a new one at the end of the key's queue.
    async fn own_node(&self, request: &AcquireRequest) -> Result<Own> {
        let lease = request.lease_id();
        if let Some(own) = self.known(lease) {
            return Ok(own);
        }
        let parent = self.parent(request.key())?;
        let session = self.inner.sessions.session_for(request.ttl()).await?;
        let manual = request.renewal() == Renewal::Manual;
        let client = session.client()?;
        let uncertain = lock(&self.inner.uncertain).contains_key(&lease);
        let prefix = self.prefix(request.key(), lease);
        let path = format!("{parent}/{prefix}");
        let mut data = request.ttl().as_millis().to_string();
        if let Some(label) = request.holder_label() {
            data.push('\n');
            data.push_str(label);
        }
        let data: Arc<[u8]> = Arc::from(data.into_bytes());
        if uncertain {
            // A detached hold's earlier node is a TTL node, which this finds in no session
            // and deletes: the retry queues a new one, whose TTL counts from this attempt
            // as the core's deadline does.
            if let Some(own) = self
                .find_own(&client, &session, &parent, &prefix, request, &data)
                .await?
            {
                return Ok(self.record(lease, own));
            }
        }
        lock(&self.inner.uncertain).insert(lease, Arc::clone(&session));
        let detached = request.is_detached();
        let options = if detached {
            // The server keeps the node at least this long after its latest write, longer
            // than any end its data may name (see `detached.rs`).
            CreateMode::PersistentSequential
                .with_acls(self.inner.acls)
                .with_ttl(self.inner.config.max_ttl)
        } else {
            CreateMode::EphemeralSequential.with_acls(self.inner.acls)
        };
        // The parent is a container the server may reap between our creations.
        for _ in 0..4 {
            let sent_at = Instant::now();
            match client.create(&path, &data, &options).await {
                Ok((stat, sequence)) => {
                    session.proved(sent_at);
                    lock(&self.inner.uncertain).remove(&lease);
                    let keeper_ttl = if detached { request.ttl() } else { session.ttl };
                    let own = Own {
                        parent,
                        name: format!("{prefix}{sequence}"),
                        czxid: stat.czxid,
                        manual: manual.then(|| Arc::new(SessionKeeper::new(sent_at, keeper_ttl))),
                        session,
                        ahead: Arc::default(),
                        granted: false,
                        key: request.key().clone(),
                        claimed: None,
                        detached,
                        data,
                        created: stat.mtime,
                    };
                    return Ok(self.record(lease, own));
                }
                Err(ZkError::NoNode) => self.make_parent(&client, &parent).await?,
                Err(err) => return Err(session.failed(err, "creating the lock node")),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "zookeeper: the lock parent kept disappearing",
        ))
    }

    fn record(&self, lease: LeaseId, own: Own) -> Own {
        lock(&self.inner.uncertain).remove(&lease);
        {
            let mut nodes = lock(&self.inner.own);
            // A detached hold is left to its TTL, often without a release: forgotten once
            // that has run out, so the record stays as small as the holds that may live.
            // (Looked for only as another is made: they are few, the other nodes many.)
            if own.detached {
                let now = Instant::now();
                nodes.retain(|_, node| {
                    let status = node.keeper().status();
                    !node.detached || status.proven_at + status.ttl > now
                });
            }
            nodes.insert(lease, own.clone());
        }
        if let Some(keeper) = own.manual.as_ref().filter(|_| !own.detached) {
            tokio::spawn(end_unrenewed(
                Arc::downgrade(&self.inner),
                lease,
                own.clone(),
                Arc::clone(keeper),
            ));
        }
        own
    }

    /// Looks for the node an unanswered creation of `lease` may have left in `parent`.
    /// One left in another session (that this client has since ended) is deleted.
    async fn find_own(
        &self,
        client: &Client,
        session: &Arc<ZkSession>,
        parent: &str,
        prefix: &str,
        request: &AcquireRequest,
        data: &Arc<[u8]>,
    ) -> Result<Option<Own>> {
        let manual = request.renewal() == Renewal::Manual;
        let children = match client.list_children(parent).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(session.failed(err, "looking for the lock node")),
        };
        let Some(name) = children.into_iter().find(|name| name.starts_with(prefix)) else {
            return Ok(None);
        };
        let path = format!("{parent}/{name}");
        let sent_at = Instant::now();
        let (sync, read) = (client.sync(&path), client.check_stat(&path));
        match after_sync(sync, read).await {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id => {
                session.proved(sent_at);
                Ok(Some(Own {
                    parent: parent.to_string(),
                    name,
                    czxid: stat.czxid,
                    manual: manual.then(|| Arc::new(SessionKeeper::new(sent_at, session.ttl))),
                    session: Arc::clone(session),
                    ahead: Arc::default(),
                    granted: false,
                    key: request.key().clone(),
                    claimed: None,
                    detached: false,
                    data: Arc::clone(data),
                    created: stat.mtime,
                }))
            }
            Ok(Some(_)) => {
                let _ = delete_node(client, &path).await?;
                Ok(None)
            }
            Ok(None) => Ok(None),
            Err(err) => Err(session.failed(err, "looking for the lock node")),
        }
    }

    /// Creates the container `parent` (and, as persistent nodes, what is missing above it).
    async fn make_parent(&self, client: &Client, parent: &str) -> Result<()> {
        let container = CreateMode::Container.with_acls(self.inner.acls);
        for _ in 0..2 {
            match client.create(parent, &[], &container).await {
                Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
                Err(ZkError::NoNode) => {
                    let above = &parent[..parent.rfind('/').unwrap_or(0)];
                    let persistent = CreateMode::Persistent.with_acls(self.inner.acls);
                    client
                        .mkdir(above, &persistent)
                        .await
                        .map_err(|err| into_error(err, "creating the lock path"))?;
                }
                Err(err) => return Err(into_error(err, "creating the lock parent")),
            }
        }
        Ok(())
    }

    /// Where `own` stands in its queue, read through its own session (which has seen its
    /// creation, so every node ahead of it too).
    async fn place(&self, own: &Own) -> Result<Place> {
        let client = match own.session.client() {
            Ok(client) => client,
            // A detached hold's node outlives the session that created it.
            Err(_) if own.detached => self.inner.control.clone(),
            // A node dies with its session.
            Err(_) => return Ok(Place::Gone),
        };
        // The holder just ahead is gone, and no node can be created ahead of ours.
        if own.ahead.take_turn() {
            return Ok(Place::First);
        }
        // Each round but the last may end one detached hold at the head that has run out.
        for _ in 0..8 {
            let sent_at = Instant::now();
            let (sync, read) = (client.sync(&own.parent), client.list_children(&own.parent));
            let children = match after_sync(sync, read).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => return Ok(Place::Gone),
                Err(err) => return Err(own.session.failed(err, "reading the queue")),
            };
            own.proved(sent_at);
            let listed = children.contains(&own.name);
            let queue = contenders(children);
            let at = queue.iter().position(|c| c.name == own.name);
            if let (Some(at), true) = (at, own.key.primitive() != Primitive::Mutex) {
                // No detached hold is ever shared: the rank rules alone decide.
                return Ok(match shared::rank(&own.key, own.key.kind(), &queue, at) {
                    Ok(Rank::Turn) => Place::First,
                    Ok(Rank::Behind { deciders, decisive }) => {
                        own.ahead.saw(deciders, decisive);
                        Place::Behind
                    }
                    Err(err) => Place::Refused(err),
                });
            }
            return Ok(match at {
                Some(0) => Place::First,
                Some(at) => {
                    // Only a node named as this crate names them may be a detached hold.
                    let head = &queue[0];
                    let ours = head.name.starts_with("_c_") && head.lease_id().is_some();
                    if ours
                        && self
                            .ended_if_over(&client, own, &head.name, at == 1)
                            .await?
                    {
                        continue;
                    }
                    own.ahead.saw(vec![queue[at - 1].name.clone()], at == 1);
                    Place::Behind
                }
                None if !listed => Place::Gone,
                // A node that exists is never taken for gone: forgetting it would leak it,
                // and it would block the queue for as long as its session lives.
                None => {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        format!(
                            "zookeeper: the lock node name {:?} has no sequence",
                            own.name
                        ),
                    ))
                }
            });
        }
        // Many holds ran out unended: behind, for now (the next look goes on).
        Ok(Place::Behind)
    }

    /// Ends the hold of `head`, the first node of `own`'s queue, if it is a detached hold
    /// that has run out by the server's clock, as the server would (lazily) itself: its
    /// latest write's `mtime` plus its TTL ([`held_for`]) is no later than a server time
    /// known to have passed: the `mtime` of our node's creation, or else, when `probe`,
    /// of a write of our node's data, unchanged. Only the node just behind the head
    /// probes: a write wakes the waiter behind it, whose look would write again, and so on
    /// down the queue. The delete is conditional on the version read, so a hold whose end was set anew
    /// meanwhile ([`expire_in`](LockBackend::expire_in)) is left alone. Whether `head` is
    /// gone.
    async fn ended_if_over(
        &self,
        client: &Client,
        own: &Own,
        head: &str,
        probe: bool,
    ) -> Result<bool> {
        let path = format!("{}/{head}", own.parent);
        let (data, stat) = match client.get_data(&path).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => return Ok(true),
            Err(err) => return Err(own.session.failed(err, "reading the holder")),
        };
        let Some(held_for) = held_for(&data, stat.ephemeral_owner) else {
            return Ok(false);
        };
        let over = |now: i64| now.saturating_sub(stat.mtime) >= held_for;
        if !over(own.created) {
            // A detached hold's own node is never written to read the clock: a write
            // restarts its TTL.
            if own.detached || !probe {
                return Ok(false);
            }
            let now = match client.set_data(&own.path(), &own.data, None).await {
                Ok(written) => written.mtime,
                Err(ZkError::NoNode) => return Ok(false),
                Err(err) => return Err(own.session.failed(err, "reading the server's clock")),
            };
            if !over(now) {
                return Ok(false);
            }
        }
        match client.delete(&path, Some(stat.version)).await {
            Ok(()) | Err(ZkError::NoNode) => Ok(true),
            // Written since it was read: its end was set anew.
            Err(ZkError::BadVersion) => Ok(false),
            Err(err) => Err(own.session.failed(err, "ending a hold that ran out")),
        }
    }

    /// Sets the end of `lease_id`'s detached hold on `key` to `ttl` from now, by the
    /// server's clock: rewrites the TTL in its node's data (a write restarts the TTL from
    /// its `mtime`), conditional on the version read. A hold that had already run out
    /// when it was written is deleted instead, as its TTL would have had it.
    async fn set_end(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let own = self.known(lease_id);
        let path = match &own {
            Some(own) => own.path(),
            None => match self.find_by_name(key, lease_id).await? {
                Some(path) => path,
                None => return Ok(Ownership::NotHeld),
            },
        };
        let client = own
            .as_ref()
            .and_then(|own| own.session.client().ok())
            .unwrap_or_else(|| self.inner.control.clone());
        let (sync, read) = (client.sync(&path), client.get_data(&path));
        let (data, stat) = match after_sync(sync, read).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => {
                self.forget(lease_id);
                return Ok(Ownership::NotHeld);
            }
            Err(err) => return Err(into_error(err, "reading the holder")),
        };
        let Some(held_for) = held_for(&data, stat.ephemeral_owner) else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "zookeeper: only a detached hold (a once ticket) can have its end set; this \
                 one lives by its session",
            ));
        };
        // The server deletes the node `max_ttl` after this write at the earliest.
        self.inner.capabilities.check_ttl(ttl)?;
        let millis = ttl.as_nanos().div_ceil(1_000_000);
        let sent_at = Instant::now();
        let rewritten = with_ttl(&data, millis);
        let written = match client.set_data(&path, &rewritten, Some(stat.version)).await {
            Ok(written) => written,
            Err(ZkError::NoNode) => {
                self.forget(lease_id);
                return Ok(Ownership::NotHeld);
            }
            Err(ZkError::BadVersion) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    "zookeeper: a hold's node changed as its end was set; retrying",
                ))
            }
            Err(err) => return Err(into_error(err, "setting a hold's end")),
        };
        if written.mtime.saturating_sub(stat.mtime) >= held_for {
            // It had run out before this write (nobody else can hold the key while its
            // node exists): it ends now.
            let _ = client.delete(&path, Some(written.version)).await;
            self.forget(lease_id);
            return Ok(Ownership::NotHeld);
        }
        if let Some(entry) = lock(&self.inner.own).get_mut(&lease_id) {
            entry.manual = Some(Arc::new(SessionKeeper::new(sent_at, ttl)));
        }
        Ok(Ownership::Held)
    }

    /// Grants `lease` its key, its node's turn having come: a mutex's token is its node's
    /// creation zxid; a shared hold's is the zxid of its grant's write ([`Self::claim`]).
    async fn take(&self, lease: LeaseId, own: &Own) -> Result<Grant> {
        let token = match own.key.primitive() {
            Primitive::Mutex => FencingToken::new(own.czxid.unsigned_abs()),
            _ => self.claim(lease, own).await?,
        };
        Ok(self.grant(lease, own, token))
    }

    /// Writes a shared hold's grant into its node (its data again, expecting version 0)
    /// and answers the write's zxid as its token. Shared holds are not granted in creation
    /// order (readers behind a writer, permits ahead of a slower one), so a creation zxid
    /// could be below a token granted before; a write at the grant is above every one.
    /// The node's version says it was granted: a retry whose reply was lost finds version
    /// 1 and answers the same zxid (the node's `mzxid`).
    async fn claim(&self, lease: LeaseId, own: &Own) -> Result<FencingToken> {
        if let Some(token) = own.claimed {
            return Ok(token);
        }
        let client = own.session.client()?;
        let path = own.path();
        let sent_at = Instant::now();
        let zxid = match client.set_data(&path, &own.data, Some(0)).await {
            Ok(stat) => stat.mzxid,
            Err(ZkError::BadVersion) => match client.check_stat(&path).await {
                Ok(Some(stat)) => stat.mzxid,
                Ok(None) => return Err(vanished()),
                Err(err) => return Err(own.session.failed(err, "reading the grant")),
            },
            Err(ZkError::NoNode) => return Err(vanished()),
            Err(err) => return Err(own.session.failed(err, "writing the grant")),
        };
        own.proved(sent_at);
        let token = FencingToken::new(zxid.unsigned_abs());
        if let Some(entry) = lock(&self.inner.own).get_mut(&lease) {
            entry.claimed = Some(token);
        }
        Ok(token)
    }

    fn grant(&self, lease: LeaseId, own: &Own, token: FencingToken) -> Grant {
        if let Some(entry) = lock(&self.inner.own).get_mut(&lease) {
            entry.granted = true;
        }
        if own.detached {
            // It lives by its TTL alone, whatever becomes of its session.
            return Grant::new(token);
        }
        Grant::in_session(token, own.keeper().session())
    }

    /// Deletes `own`'s node (through its session while it lives) and forgets it.
    async fn remove(&self, lease: LeaseId, own: &Own) -> Result<Ownership> {
        let client = own
            .session
            .client()
            .unwrap_or_else(|_| self.inner.control.clone());
        let deleted = delete_node(&client, &own.path()).await?;
        self.forget(lease);
        Ok(deleted)
    }

    /// Deletes the node an unanswered creation of `lease` may have left; `None` when no
    /// creation of it is unanswered.
    async fn remove_unconfirmed(&self, key: &LockKey, lease: LeaseId) -> Result<Option<Ownership>> {
        let Some(session) = lock(&self.inner.uncertain).remove(&lease) else {
            return Ok(None);
        };
        // A session that ended took its nodes with it.
        let Ok(client) = session.client() else {
            return Ok(Some(Ownership::NotHeld));
        };
        let parent = self.parent(key)?;
        let prefix = self.prefix(key, lease);
        let children = match client.list_children(&parent).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(Some(Ownership::NotHeld)),
            Err(err) => {
                // Still unresolved: the next release or retry looks again.
                lock(&self.inner.uncertain).insert(lease, Arc::clone(&session));
                return Err(session.failed(err, "looking for the lock node"));
            }
        };
        let Some(name) = children.into_iter().find(|name| name.starts_with(&prefix)) else {
            return Ok(Some(Ownership::NotHeld));
        };
        let deleted = delete_node(&client, &format!("{parent}/{name}")).await;
        if deleted.is_err() {
            lock(&self.inner.uncertain).insert(lease, Arc::clone(&session));
        }
        deleted.map(Some)
    }

    /// The node of `lease` in `key`'s queue, found by its name (for a lease this client
    /// did not create, or no longer knows).
    async fn find_by_name(&self, key: &LockKey, lease: LeaseId) -> Result<Option<String>> {
        let parent = self.parent(key)?;
        let prefix = self.prefix(key, lease);
        self.catch_up(&parent).await?;
        match self.inner.control.list_children(&parent).await {
            Ok(children) => Ok(children
                .into_iter()
                .find(|name| name.starts_with(&prefix))
                .map(|name| format!("{parent}/{name}"))),
            Err(ZkError::NoNode) => Ok(None),
            Err(err) => Err(into_error(err, "reading the queue")),
        }
    }

    /// Catches the control session's server up with the leader, so what another session
    /// saw answered is seen through the control session too.
    async fn catch_up(&self, path: &str) -> Result<()> {
        catch_up(&self.inner.control, path).await
    }

    /// The holder of `parent`'s queue: its node, data and creation zxid.
    async fn holder(&self, parent: &str) -> Result<Option<(Contender, usize, Vec<u8>, i64)>> {
        let control = &self.inner.control;
        self.catch_up(parent).await?;
        for _ in 0..8 {
            let children = match control.list_children(parent).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => return Ok(None),
                Err(err) => return Err(into_error(err, "reading the queue")),
            };
            let queue = contenders(children);
            let Some(first) = queue.first() else {
                return Ok(None);
            };
            match control.get_data(&format!("{parent}/{}", first.name)).await {
                Ok((data, stat)) => {
                    return Ok(Some((first.clone(), queue.len() - 1, data, stat.czxid)))
                }
                // Released meanwhile: look again.
                Err(ZkError::NoNode) => continue,
                Err(err) => return Err(into_error(err, "reading the holder")),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "zookeeper: the holder kept changing while it was looked up",
        ))
    }

    /// What `inspect` and `holders` tell of the holding `node`, read as `data`, created at
    /// `czxid` and holding with `token`, with `waiters` behind.
    fn holder_info(
        &self,
        node: &Contender,
        data: &[u8],
        czxid: i64,
        token: i64,
        waiters: usize,
        kind: HoldKind,
    ) -> HolderInfo {
        let text = String::from_utf8_lossy(data);
        let (ttl, label) = match text.split_once('\n') {
            Some((ttl, label)) => (ttl.parse::<u64>().ok(), Some(label.to_string())),
            None => (text.parse::<u64>().ok(), None),
        };
        let lease_id = node
            .lease_id()
            .unwrap_or_else(|| LeaseId::from_u128(u128::from(czxid.unsigned_abs())));
        // Our own session's deadline where we know it; otherwise the session timeout the
        // holder asked for (an upper bound: ZooKeeper does not tell how long ago a session
        // was last heard from).
        let remaining_ttl = match self.known(lease_id) {
            Some(own) => {
                let status = own.keeper().status();
                (status.proven_at + status.ttl).saturating_duration_since(Instant::now())
            }
            None => Duration::from_millis(ttl.unwrap_or(0)),
        };
        HolderInfo {
            lease_id,
            token: FencingToken::new(token.unsigned_abs()),
            remaining_ttl,
            waiters: Some(waiters),
            holder: label.filter(|_| ttl.is_some()),
            kind,
        }
    }

    /// The path of `lease`'s node in `key`'s queue if it is the first there (holds the
    /// lock), read after a sync with the leader.
    async fn holding_node(&self, key: &LockKey, lease: LeaseId) -> Result<Option<String>> {
        if let Some(own) = self.known(lease) {
            if own.keeper().status().expired {
                return Ok(None);
            }
        }
        let parent = self.parent(key)?;
        let prefix = self.prefix(key, lease);
        let control = &self.inner.control;
        self.catch_up(&parent).await?;
        let children = match control.list_children(&parent).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(into_error(err, "reading the queue")),
        };
        Ok(contenders(children)
            .into_iter()
            .next()
            .filter(|first| first.name.starts_with(&prefix))
            .map(|first| format!("{parent}/{}", first.name)))
    }
}

impl Inner {
    /// Forgets the node of `lease` (only if it is still `name`, when given); a lease renewed
    /// by hand stops being followed.
    fn forget(&self, lease: LeaseId, name: Option<&str>) {
        let mut own = lock(&self.own);
        if name.is_some_and(|name| own.get(&lease).is_none_or(|o| o.name != name)) {
            return;
        }
        if let Some(own) = own.remove(&lease) {
            if let Some(keeper) = own.manual {
                keeper.expired();
            }
        }
    }
}

/// Ends a lease renewed by hand once its TTL has passed since the latest request that
/// proved it: the server alone would keep its node as long as the shared session lives
/// (the client library pings it), so the client deletes the node itself, as the server
/// would have on a session of its own. Also ends it with its session. If the process
/// dies, the server ends the session, and the node with it, after the same TTL.
async fn end_unrenewed(inner: Weak<Inner>, lease: LeaseId, own: Own, keeper: Arc<SessionKeeper>) {
    let mut renewed = keeper.session();
    let mut session = own.session.keeper.session();
    loop {
        let status = keeper.status();
        if status.expired {
            return;
        }
        let end = tokio::time::Instant::from_std(status.proven_at + status.ttl);
        tokio::select! {
            () = tokio::time::sleep_until(end) => {
                if keeper.status().proven_at + status.ttl > Instant::now() {
                    continue;
                }
                break;
            }
            alive = session.changed() => {
                if !alive || session.status().expired {
                    break;
                }
            }
            _ = renewed.changed() => {}
        }
    }
    keeper.expired();
    if let Some(inner) = inner.upgrade() {
        inner.forget(lease, Some(&own.name));
    }
    // Retried until it lands or the session ends (taking the node with it): the session is
    // shared and kept alive for as long as the client lives, so a node whose delete failed
    // once (a short disconnect) would otherwise block the key for as long.
    let path = own.path();
    let backoff = lock_core::Backoff {
        initial: Duration::from_millis(50),
        max: own.session.ttl,
    };
    let (outcome, tries) = backoff
        .retry_until(
            None,
            |err| unanswered(err) && own.session.client().is_ok(),
            || async {
                let Ok(client) = own.session.client() else {
                    return Ok(Ownership::NotHeld);
                };
                with_timeout(
                    "zookeeper",
                    own.session.ttl,
                    "deleting the lock node",
                    delete_node(&client, &path),
                )
                .await
            },
        )
        .await;
    if let Err(err) = outcome {
        tracing::debug!(error = %err, tries, "deleting an expired lease's node failed; it ends with its session");
    }
}

/// The answer to `read`, made just after `sync` (the client sends a request when it is
/// made, so the sync goes out first, and the server answers a session's requests in
/// order). A server answers a sync only while it is in contact with the leader, who alone
/// expires sessions, so the answers prove the session alive to the leader, not only to a
/// follower that may have lost contact with it (which goes on answering plain reads for
/// `syncLimit × tickTime`).
async fn after_sync<T>(
    sync: impl std::future::Future<Output = std::result::Result<(), ZkError>>,
    read: impl std::future::Future<Output = std::result::Result<T, ZkError>>,
) -> std::result::Result<T, ZkError> {
    sync.await?;
    read.await
}

/// A node of ours gone from under a request (its session ended): the request is retried.
fn vanished() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        "zookeeper: the lock node vanished (its session ended); retrying",
    )
}

/// Deletes the node at `path`; [`Ownership::NotHeld`] if it was not there.
async fn delete_node(client: &Client, path: &str) -> Result<Ownership> {
    match client.delete(path, None).await {
        Ok(()) => Ok(Ownership::Held),
        Err(ZkError::NoNode) => Ok(Ownership::NotHeld),
        Err(err) => Err(into_error(err, "deleting the lock node")),
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let lease = request.lease_id();
        let own = self.own_node(request).await?;
        match self.place(&own).await? {
            Place::First => Ok(Some(self.take(lease, &own).await?)),
            // Never jumps the queue: a node behind others is taken back at once.
            Place::Behind => {
                let _ = self.remove(lease, &own).await?;
                Ok(None)
            }
            Place::Refused(err) => {
                let _ = self.remove(lease, &own).await?;
                Err(err)
            }
            Place::Gone => {
                self.forget(lease);
                Err(vanished())
            }
        }
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let Some(own) = self.known(lease_id).filter(|own| own.granted) else {
            return Ok(Ownership::NotHeld);
        };
        if own.detached {
            // Nothing keeps a detached hold alive: renewing it sets its end `ttl` from now.
            return self.set_end(key, lease_id, ttl).await;
        }
        if ttl > own.session.ttl {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "a ZooKeeper lease keeps the TTL of its session ({:?}); it cannot be \
                     renewed for {ttl:?}",
                    own.session.ttl
                ),
            ));
        }
        let Ok(client) = own.session.client() else {
            return Ok(Ownership::NotHeld);
        };
        let sent_at = Instant::now();
        let path = own.path();
        let (sync, read) = (client.sync(&path), client.check_stat(&path));
        match after_sync(sync, read).await {
            Ok(Some(stat)) if stat.ephemeral_owner == own.session.id => {
                own.proved(sent_at);
                Ok(Ownership::Held)
            }
            Ok(_) => {
                self.forget(lease_id);
                Ok(Ownership::NotHeld)
            }
            Err(err) if crate::error::ends_session(&err) => {
                own.session.end();
                Ok(Ownership::NotHeld)
            }
            Err(err) => Err(into_error(err, "renewing")),
        }
    }

    /// Rewrites the TTL in the detached hold's node (see *Once tickets* in the crate docs);
    /// any TTL up to `max_ttl`, shorter or longer than the one it had.
    async fn expire_in(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl: Duration,
    ) -> Result<Ownership> {
        self.set_end(key, lease_id, ttl).await
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        if let Some(own) = self.known(lease_id) {
            return self.remove(lease_id, &own).await;
        }
        if let Some(removed) = self.remove_unconfirmed(key, lease_id).await? {
            return Ok(removed);
        }
        match self.find_by_name(key, lease_id).await? {
            Some(path) => delete_node(&self.inner.control, &path).await,
            None => Ok(Ownership::NotHeld),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        if key.primitive() != Primitive::Mutex {
            return Ok(self.holders(key).await?.into_iter().next());
        }
        let parent = self.parent(key)?;
        let Some((first, waiters, data, czxid)) = self.holder(&parent).await? else {
            return Ok(None);
        };
        Ok(Some(self.holder_info(
            &first,
            &data,
            czxid,
            czxid,
            waiters,
            HoldKind::Mutex,
        )))
    }

    /// Every node of `key`'s queue whose turn has come by the rank rules, by token (a
    /// distlock holder's is its grant's write; a node not written, another recipe's or
    /// one whose waiter has not taken its turn yet, shows its creation zxid). A mutex's
    /// holder is [`inspect`](LockBackend::inspect)'s.
    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        let primitive = key.primitive();
        if primitive == Primitive::Mutex {
            return Ok(self.inspect(key).await?.into_iter().collect());
        }
        let parent = self.parent(key)?;
        let control = &self.inner.control;
        self.catch_up(&parent).await?;
        let queue = match control.list_children(&parent).await {
            Ok(children) => contenders(children),
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(into_error(err, "reading the queue")),
        };
        let holding: Vec<&Contender> = (0..queue.len())
            .filter(|&at| shared::holds(key, primitive, &queue, at))
            .map(|at| &queue[at])
            .collect();
        let waiters = queue.len() - holding.len();
        // Sent together: the client writes each request as it is made.
        let reads: Vec<_> = holding
            .iter()
            .map(|node| control.get_data(&format!("{parent}/{}", node.name)))
            .collect();
        let mut holders = Vec::with_capacity(holding.len());
        for (node, read) in holding.into_iter().zip(reads) {
            let (data, stat) = match read.await {
                Ok(read) => read,
                // Released since the listing.
                Err(ZkError::NoNode) => continue,
                Err(err) => return Err(into_error(err, "reading a holder")),
            };
            let token = if stat.version > 0 {
                stat.mzxid
            } else {
                stat.czxid
            };
            let kind = shared::kind_of(primitive, &node.name).unwrap_or(key.kind());
            holders.push(self.holder_info(node, &data, stat.czxid, token, waiters, kind));
        }
        holders.sort_by_key(|holder| holder.token);
        Ok(holders)
    }

    /// Keys starting with `prefix` whose parents (of any primitive) still hold lock nodes
    /// (held, queued or left behind). Empty parents are not counted: the server reaps them.
    /// Distlock layout only.
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let control = &self.inner.control;
        let root = &self.inner.config.root;
        self.catch_up(root).await?;
        let names = match control.list_children(root).await {
            Ok(names) => names,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(into_error(err, "listing the lock root")),
        };
        let keys: Vec<(String, String)> = names
            .into_iter()
            .filter_map(|name| key_of_parent(&name).map(|key| (name, key)))
            .filter(|(_, key)| key.starts_with(prefix))
            .collect();
        let found: Vec<Result<Option<String>>> = futures_util::stream::iter(keys)
            .map(|(name, key)| async move {
                match control.list_children(&format!("{root}/{name}")).await {
                    Ok(children) if !children.is_empty() => Ok(Some(key)),
                    Ok(_) | Err(ZkError::NoNode) => Ok(None),
                    Err(err) => Err(into_error(err, "listing a lock parent")),
                }
            })
            .buffer_unordered(128)
            .collect()
            .await;
        let mut keys: Vec<String> = found
            .into_iter()
            .filter_map(Result::transpose)
            .collect::<Result<_>>()?;
        keys.sort();
        // A key's mutex, semaphore and reader-writer lock are three parents.
        keys.dedup();
        Ok(keys)
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let config = &self.inner.config;
        if config.layout != Layout::Distlock {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "zookeeper: with layout=curator the lock paths are anywhere in the tree, so \
                 held keys cannot be listed",
            ));
        }
        let root = &config.root;
        self.catch_up(root).await?;
        let names = match self.inner.control.list_children(root).await {
            Ok(names) => names,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(into_error(err, "listing the lock root")),
        };
        let mut keys: Vec<LockKey> = names
            .iter()
            .filter_map(|name| decode_key(name))
            .filter(|key| key.starts_with(prefix))
            .filter_map(|key| LockKey::new(key).ok())
            .collect();
        keys.sort();
        // Most parents of a busy root are empty or reaped; look at many at once, in order.
        let mut looks = futures_util::stream::iter(keys)
            .map(|key| async move {
                let info = self.inspect(&key).await;
                (key, info)
            })
            .buffered(32);
        let mut held = Vec::new();
        while held.len() < limit {
            let Some((key, info)) = looks.next().await else {
                break;
            };
            if let Some(info) = info? {
                held.push((key, info));
            }
        }
        Ok(held)
    }

    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        if request.is_detached() {
            // Nothing would keep its node while it waits; a once ticket never waits.
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "zookeeper: a detached hold (a once ticket) never waits in a key's queue",
            ));
        }
        self.own_node(request).await.map(|_| ())
    }

    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        let lease = request.lease_id();
        let Some(own) = self.known(lease) else {
            return Ok(Turn::NotQueued);
        };
        Ok(match self.place(&own).await? {
            Place::First => Turn::Granted(self.take(lease, &own).await?),
            Place::Behind => Turn::Waiting,
            Place::Refused(err) => {
                let _ = self.remove(lease, &own).await?;
                return Err(err);
            }
            Place::Gone => {
                self.forget(lease);
                Turn::NotQueued
            }
        })
    }

    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        match self.known(lease_id) {
            Some(own) if own.granted => Ok(()),
            Some(own) => self.remove(lease_id, &own).await.map(|_| ()),
            None => self.remove_unconfirmed(key, lease_id).await.map(|_| ()),
        }
    }

    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        let Some(own) = self.known(request.lease_id()) else {
            return Ok(None);
        };
        let client = own.session.client()?;
        Ok(Some(Box::new(TurnWatch::new(
            client, own.parent, own.name, own.key, own.ahead,
        ))))
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        self.inner.records.read(key).await
    }

    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        let millis = Record::retention_millis(retention)?;
        let Some(holder) = self.holding_node(key, lease_id).await? else {
            return Ok(Ownership::NotHeld);
        };
        self.inner.records.write(&holder, key, record, millis).await
    }
}
