//! The etcd `LockBackend`: a client-side mutex with a fair queue, in transactions.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use futures_util::StreamExt;
use lock_core::backend::async_trait;
use lock_core::backend::{
    with_timeout, AcquireRequest, Capabilities, Grant, HolderInfo, KeyWatch, LockBackend,
    Ownership, Record, Turn,
};
use lock_core::{Error, ErrorKind, FencingToken, LeaseId, LockKey, Primitive, Result};
use tokio::time::timeout;

use crate::config::{EtcdConfig, Layout};
use crate::detached::DetachedLeases;
use crate::error::{into_error, is_lease_not_found};
use crate::keys::{parse_value, range_end, value, KeySpace};
use crate::records::RecordLeases;
use crate::retired::{Attempts, Sending};
use crate::session::{EtcdSession, Sessions};
use crate::watch::{DirWatch, Own, TurnWatch};

/// How often an idle HTTP/2 connection is pinged: above etcd's default
/// `--grpc-keepalive-min-time` of 5 s, under which etcd drops the connection.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);

/// Locks in etcd: entries attached to the client's etcd leases, a fair queue per key
/// ordered by create revision, and the owner entry's create revision as fencing token.
/// See the crate docs for the layout and the guarantees.
///
/// Clones share one connection and one set of sessions; dropping the last clone revokes
/// the client's leases, except those of detached holds (once tickets), which live by
/// their TTL alone.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    capabilities: Capabilities,
    pub(crate) keys: KeySpace,
    pub(crate) request_timeout: Duration,
    endpoints: Vec<String>,
    pub(crate) sessions: Sessions,
    detached: Arc<DetachedLeases>,
    pub(crate) attempts: Attempts,
    records: RecordLeases,
}

/// The ask of one acquisition: which session it lives by and its entry.
pub(crate) struct Attempt {
    /// For a detached hold, its own etcd lease, which no session keeps.
    pub(crate) session: Arc<EtcdSession>,
    pub(crate) detached: bool,
    pub(crate) dir: Vec<u8>,
    pub(crate) entry: Vec<u8>,
}

impl EtcdBackend {
    /// Connects to the cluster `config` names and checks that it is etcd, that it answers
    /// and that it accepts the credentials. Each step of connecting (reaching a member,
    /// the HTTP/2 handshake, authentication, the member's status) is bounded by the
    /// connect time-out; the first read of the lock namespace by the request time-out.
    /// Outside a Tokio runtime it is [`ErrorKind::InvalidInput`].
    pub async fn connect(config: &EtcdConfig) -> Result<Self> {
        lock_core::backend::require_runtime("etcd")?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            // Notices a silently dead connection, so keep-alives move to a new one. etcd
            // closes connections that ping more often than every 5 s
            // (`--grpc-keepalive-min-time`) or ping with no stream open.
            .with_keep_alive(HTTP2_PING_INTERVAL, config.request_timeout)
            .with_keep_alive_while_idle(false);
        if let Some((user, password)) = config.credentials() {
            options = options.with_user(user, password);
        }
        let bound = config.request_timeout;
        // The client's own connect time-out covers only the TCP connection: a listener
        // that accepts and never answers would hold the HTTP/2 handshake (and the
        // authentication request made while connecting) for ever.
        let step = config.connect_timeout;
        let client = match timeout(step, Client::connect(config.endpoints(), Some(options))).await {
            Err(_) => return Err(no_answer(config, "connecting")),
            Ok(Err(err)) => return Err(connect_failed(config, "connecting", err).await),
            Ok(Ok(client)) => client,
        };
        // A member answers its status itself, without raft: the first answer over the new
        // connection, which shows it is etcd and names its version.
        match timeout(step, client.maintenance_client().status()).await {
            Err(_) => return Err(no_answer(config, "reading the server status")),
            Ok(Ok(status)) => crate::server::warn_if_unsafe(status.version()),
            // Some servers let only administrators read their status: the version check
            // is skipped, the namespace read below still checks the credentials.
            Ok(Err(err)) if crate::error::kind_of(&err) == ErrorKind::PermissionDenied => {
                tracing::debug!("etcd: the server status is not readable with these credentials");
            }
            Ok(Err(err)) => {
                return Err(connect_failed(config, "reading the server status", err).await)
            }
        }
        let keys = KeySpace::new(&config.prefix, config.layout);
        let probe = GetOptions::new().with_limit(1).with_keys_only();
        let what = "reading the lock namespace";
        with_timeout("etcd", bound, what, async {
            let read = client.kv_client().get(keys.root(), Some(probe)).await;
            read.map_err(|err| into_error(err, what))
        })
        .await?;
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                sessions: Sessions::new(client.clone(), bound),
                detached: Arc::new(DetachedLeases::new(client.clone(), bound)),
                client,
                capabilities: config.capabilities(),
                keys,
                request_timeout: bound,
                endpoints: config.endpoints().to_vec(),
                attempts: Attempts::default(),
                records: RecordLeases::default(),
            }),
        })
    }

    pub(crate) fn kv(&self) -> etcd_client::KvClient {
        self.inner.client.kv_client()
    }

    /// One request, bounded by the request time-out, its error mapped.
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        request: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        with_timeout("etcd", self.inner.request_timeout, what, async {
            request.await.map_err(|err| into_error(err, what))
        })
        .await
    }

    /// A transaction that writes with `session`'s lease: a lease the store no longer has
    /// ends the session, and the attempt is retried under a new one. `sending` (an
    /// acquisition's write) is marked answered when etcd answers.
    pub(crate) async fn txn_in(
        &self,
        what: &str,
        session: &EtcdSession,
        txn: Txn,
        sending: Option<Sending<'_>>,
    ) -> Result<TxnResponse> {
        let sent = with_timeout("etcd", self.inner.request_timeout, what, async {
            Ok(self.kv().txn(txn).await)
        })
        .await?;
        // Applied, refused, or refused for a lease that is gone (nothing of it can land):
        // any other error leaves it unknown whether the write is still on its way.
        if sent.as_ref().is_ok() || sent.as_ref().is_err_and(is_lease_not_found) {
            if let Some(sending) = sending {
                sending.answered();
            }
        }
        match sent {
            Err(err) if is_lease_not_found(&err) => {
                session.ended();
                Err(Error::new(
                    ErrorKind::Unavailable,
                    "etcd: the session's lease ended before the request; retrying under a new one",
                ))
            }
            other => other.map_err(|err| into_error(err, what)),
        }
    }

    /// The session and entry `request` acquires with.
    pub(crate) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.inner.keys.check(request.key())?;
        let ttl = request.store_ttl();
        let session = if request.is_detached() {
            self.inner
                .detached
                .lease_for(request.lease_id(), ttl)
                .await?
        } else {
            let own = self.inner.keys.layout() == Layout::EtcdMutex;
            self.inner.sessions.session(request, own, ttl).await?
        };
        let dir = self.inner.keys.dir(request.key());
        let entry = self
            .inner
            .keys
            .entry(request.key(), request.lease_id(), session.lease);
        Ok(Attempt {
            session,
            detached: request.is_detached(),
            dir,
            entry,
        })
    }

    fn put_entry(&self, request: &AcquireRequest, attempt: &Attempt) -> TxnOp {
        let label = match self.inner.keys.layout() {
            Layout::Distlock => request.holder_label(),
            // Release recognises the entry by its whole value there.
            Layout::EtcdMutex => None,
        };
        TxnOp::put(
            attempt.entry.clone(),
            value(request.lease_id(), label),
            Some(PutOptions::new().with_lease(attempt.session.lease)),
        )
    }

    /// No tombstone of `request`'s acquisition on `attempt`'s session: its clean-up has not
    /// run (see `retired.rs`).
    pub(crate) fn not_retired(&self, request: &AcquireRequest, attempt: &Attempt) -> Compare {
        let tombstone = self
            .inner
            .keys
            .tombstone(attempt.session.lease, request.lease_id());
        Compare::create_revision(tombstone, CompareOp::Equal, 0)
    }

    /// The key's entries, oldest first (the first is the owner).
    fn queue(dir: &[u8], limit: i64) -> TxnOp {
        TxnOp::get(
            dir.to_vec(),
            Some(
                GetOptions::new()
                    .with_range(range_end(dir))
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(limit),
            ),
        )
    }

    /// The grant of `attempt`'s entry, created at `revision`: it lives by its session,
    /// or by its TTL alone when detached.
    pub(crate) fn grant(revision: i64, attempt: &Attempt) -> Result<Grant> {
        let token = u64::try_from(revision)
            .map_err(|_| Error::new(ErrorKind::Internal, "etcd returned a negative revision"))?;
        let token = FencingToken::new(token);
        Ok(if attempt.detached {
            Grant::new(token)
        } else {
            Grant::in_session(token, attempt.session.keeper.session())
        })
    }

    /// Where `lease_id`'s entry on `key` is, and what it holds.
    pub(crate) async fn locate(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
    ) -> Result<Option<KeyValue>> {
        let dir = self.inner.keys.dir(key);
        let mut found = match self.inner.keys.known_entry(key, lease_id) {
            Some(entry) => {
                self.call("reading an entry", self.kv().get(entry, None))
                    .await?
            }
            None => {
                let options = GetOptions::new().with_range(range_end(&dir));
                self.call("reading a queue", self.kv().get(dir, Some(options)))
                    .await?
            }
        };
        Ok(found
            .take_kvs()
            .into_iter()
            .find(|kv| parse_value(kv.value()).is_some_and(|(id, _)| id == lease_id)))
    }

    /// The etcd lease a record kept `seconds` expires with, on the cluster's clock: the
    /// client's shared one for that retention, granted when there is none that lives
    /// long enough.
    async fn record_lease(&self, seconds: i64) -> Result<i64> {
        match self.inner.records.lease_for(seconds) {
            Ok(lease) => Ok(lease),
            Err(wanted) => {
                let mut leases = self.inner.client.lease_client();
                let lease = self
                    .call("granting a record's lease", leases.grant(wanted.ttl, None))
                    .await?;
                self.inner.records.granted(seconds, wanted, lease.id());
                Ok(lease.id())
            }
        }
    }

    /// Deletes `lease_id`'s entry on `key` if it is there, only that entry: its name (or,
    /// in the etcd-mutex layout, its value) identifies the acquisition. [`Ownership::Held`] if it was.
    /// In the same transaction, leaves the tombstones that keep a write of the acquisition
    /// still on its way from landing later (see `retired.rs`).
    async fn delete_entry(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        let retire = self
            .inner
            .attempts
            .retire(lease_id, || self.inner.sessions.live_shared());
        let tombstones: Vec<TxnOp> = retire
            .sessions
            .iter()
            .map(|session| self.tombstone(session, lease_id))
            .collect();
        let target = self.release_target(key, lease_id).await?;
        let txn =
            |tombstones: &[TxnOp]| release_txn(target.as_ref(), retire.only_if_absent, tombstones);
        let Some(first) = txn(&tombstones) else {
            self.inner.attempts.retired(lease_id);
            return Ok(Ownership::NotHeld);
        };
        let sent = with_timeout("etcd", self.inner.request_timeout, "releasing", async {
            Ok(self.kv().txn(first).await)
        })
        .await?;
        let done = match sent {
            Ok(done) => Some(done),
            // The lease of a session a tombstone was for is gone, and with it every entry
            // and every later write on it: leave the others' one by one, then delete.
            Err(err) if is_lease_not_found(&err) => {
                self.leave_tombstones_one_by_one(&retire.sessions, lease_id)
                    .await?;
                match txn(&[]) {
                    Some(plain) => Some(self.call("releasing", self.kv().txn(plain)).await?),
                    None => None,
                }
            }
            Err(err) => return Err(into_error(err, "releasing")),
        };
        self.inner.attempts.retired(lease_id);
        Ok(Ownership::held_if(
            target.is_some() && done.is_some_and(|done| done.succeeded()),
        ))
    }

    /// The entry of `lease_id` on `key` that a release deletes, with the comparison that
    /// it is still that acquisition's: by its name where it is known, else by its value
    /// (found by [`locate`](Self::locate)). `None` when the key has no such entry.
    async fn release_target(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
    ) -> Result<Option<(Vec<u8>, Compare)>> {
        Ok(match self.inner.keys.known_entry(key, lease_id) {
            Some(entry) => Some((
                entry.clone(),
                Compare::create_revision(entry, CompareOp::Greater, 0),
            )),
            None => self.locate(key, lease_id).await?.map(|kv| {
                (
                    kv.key().to_vec(),
                    Compare::value(kv.key().to_vec(), CompareOp::Equal, kv.value().to_vec()),
                )
            }),
        })
    }

    /// Leaves `lease_id`'s tombstone on each of `sessions`, one transaction each, so that
    /// a session whose lease is gone does not fail the others'. Only an expired session's
    /// failure is ignored: its lease took every write on it along.
    async fn leave_tombstones_one_by_one(
        &self,
        sessions: &[Arc<EtcdSession>],
        lease_id: LeaseId,
    ) -> Result<()> {
        for session in sessions {
            let one = Txn::new().and_then([self.tombstone(session, lease_id)]);
            let left = self.txn_in("releasing", session, one, None).await;
            if left.is_err() && !session.keeper.status().expired {
                left?;
            }
        }
        Ok(())
    }

    /// The put of `lease_id`'s tombstone on `session` (see `retired.rs`).
    fn tombstone(&self, session: &EtcdSession, lease_id: LeaseId) -> TxnOp {
        TxnOp::put(
            self.inner.keys.tombstone(session.lease, lease_id),
            "",
            Some(PutOptions::new().with_lease(session.lease)),
        )
    }

    /// Deletes a detached hold's entry, fenced as any release (`release_target`), then
    /// revokes its lease, so nothing of the hold lingers and a write of the acquisition
    /// still on its way (it carries that lease) can no longer land.
    async fn release_detached(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        lease: &EtcdSession,
    ) -> Result<Ownership> {
        let target = self.release_target(key, lease_id).await?;
        let deleted = match release_txn(target.as_ref(), true, &[]) {
            Some(txn) => self
                .call("releasing", self.kv().txn(txn))
                .await?
                .succeeded(),
            None => false,
        };
        self.inner.detached.end(lease_id, lease).await;
        Ok(Ownership::held_if(target.is_some() && deleted))
    }

    /// Moves the owner entry of `key`, read as `entry`, onto etcd lease `lease`, only if
    /// it is still the one read (its create revision, which is the fencing token and which
    /// a put keeps, and its lease) and still the owner (no entry of the directory older).
    fn move_txn(&self, key: &LockKey, entry: &KeyValue, lease: i64) -> Txn {
        let granted = entry.create_revision();
        let dir = self.inner.keys.dir(key);
        Txn::new()
            .when([
                Compare::create_revision(entry.key().to_vec(), CompareOp::Equal, granted),
                Compare::lease(entry.key().to_vec(), CompareOp::Equal, entry.lease()),
                Compare::create_revision(dir.clone(), CompareOp::Greater, granted - 1)
                    .with_range(range_end(&dir)),
            ])
            .and_then([TxnOp::put(
                entry.key().to_vec(),
                entry.value().to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )])
    }

    /// Sets the end of `lease_id`'s hold, whose entry was read as `entry`, to `ttl` from
    /// now (whole seconds, rounded up, as every etcd lease): grants a new etcd lease of
    /// `ttl` and moves the entry onto it in one transaction ([`move_txn`](Self::move_txn)).
    /// The hold becomes a detached one: its former lease, if it was this hold's own, is
    /// revoked (best effort: left behind, it only runs out); a session shared with other
    /// locks is left alone.
    async fn move_to_new_lease(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        entry: &KeyValue,
        ttl: Duration,
    ) -> Result<Ownership> {
        let detached = &self.inner.detached;
        let lease = detached.grant(ttl).await?;
        let txn = self.move_txn(key, entry, lease.lease);
        // An error leaves both leases: the move may have landed, and revoking either could
        // end the hold before its time. The unused one runs out by its TTL.
        let moved = self
            .call("setting a hold's end", self.kv().txn(txn))
            .await?;
        if !moved.succeeded() {
            detached.revoke(&lease).await;
            return Ok(Ownership::NotHeld);
        }
        let former = detached.lease_of(lease_id);
        detached.remember(lease_id, lease);
        match former {
            Some(former) if former.lease == entry.lease() => detached.revoke(&former).await,
            // Its own session (renewed by hand, or the etcd-mutex layout) has nothing on
            // it any more.
            _ => self.inner.sessions.end_own(lease_id),
        }
        Ok(Ownership::Held)
    }
}

impl EtcdBackend {
    /// Keeps a queued waiter's entry alive with each attempt: one renewed by hand has
    /// nothing else keeping it (its own session's keep-alives follow its renewals).
    pub(crate) async fn keep_waiter_alive(
        &self,
        request: &AcquireRequest,
        attempt: &Attempt,
    ) -> Result<()> {
        if request.renewal() == lock_core::Renewal::Manual {
            self.inner.sessions.ping(&attempt.session).await.map(drop)
        } else {
            Ok(())
        }
    }

    /// The seconds etcd lease `lease` has left; negative when it is gone. A key written
    /// without a lease (not one of ours) never expires: 0 left, still there.
    pub(crate) async fn lease_left(&self, lease: i64) -> Result<i64> {
        if lease == 0 {
            return Ok(0);
        }
        let left = self
            .call(
                "reading a lease",
                self.inner.client.lease_client().time_to_live(lease, None),
            )
            .await?;
        Ok(left.ttl())
    }

    /// The next page of a listing's range read, `None` after the last one.
    async fn next_page(&self, pages: &mut Pages) -> Result<Option<Vec<KeyValue>>> {
        if !pages.more {
            return Ok(None);
        }
        let mut options = GetOptions::new()
            .with_range(pages.end.clone())
            .with_limit(LIST_PAGE);
        if pages.revision > 0 {
            // Every page from the first one's revision: one snapshot of the store.
            options = options.with_revision(pages.revision);
        }
        let mut page = self
            .call(
                "listing held keys",
                self.kv().get(pages.from.clone(), Some(options)),
            )
            .await?;
        if pages.revision == 0 {
            pages.revision = page.header().map_or(0, |h| h.revision());
        }
        pages.more = page.more();
        let entries = page.take_kvs();
        if let Some(last) = entries.last() {
            pages.from = last.key().to_vec();
            pages.from.push(0);
        }
        Ok(Some(entries))
    }

    /// Adds to `held` the held keys among `dirs` (in order), until it has `limit`: the
    /// owner leases of a few directories at a time are read together, each distinct lease
    /// once (the locks of one session share one).
    async fn add_held(
        &self,
        dirs: Vec<Dir>,
        limit: usize,
        held: &mut Vec<(LockKey, HolderInfo)>,
    ) -> Result<()> {
        let mut dirs = dirs.into_iter().filter(|dir| dir.key.is_some()).peekable();
        let mut left: HashMap<i64, i64> = HashMap::new();
        while held.len() < limit && dirs.peek().is_some() {
            let batch: Vec<Dir> = dirs.by_ref().take(limit - held.len()).collect();
            let unknown: HashSet<i64> = batch
                .iter()
                .map(|dir| dir.owner.lease())
                .filter(|lease| !left.contains_key(lease))
                .collect();
            let read: Vec<(i64, Result<i64>)> = futures_util::stream::iter(unknown)
                .map(|lease| async move { (lease, self.lease_left(lease).await) })
                .buffer_unordered(LEASE_READS_AT_ONCE)
                .collect()
                .await;
            for (lease, seconds) in read {
                left.insert(lease, seconds?);
            }
            for dir in batch {
                let seconds = left.get(&dir.owner.lease()).copied().unwrap_or(-1);
                if let (Some(key), Some(info)) =
                    (dir.key, holder_info(&dir.owner, dir.entries, seconds))
                {
                    held.push((key, info));
                }
            }
        }
        Ok(())
    }
}

/// No answer within the connect time-out while `what`.
fn no_answer(config: &EtcdConfig, what: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "etcd: {what}: no answer from {} within the connect time-out ({:?})",
            config.endpoints().join(","),
            config.connect_timeout
        ),
    )
}

/// The error for a connect step that failed with `err`: a server that is not etcd is
/// named as such rather than reported as an unexplained transport failure.
async fn connect_failed(config: &EtcdConfig, what: &str, err: etcd_client::Error) -> Error {
    if let etcd_client::Error::GRpcStatus(status) = &err {
        if status.code() == tonic::Code::Unimplemented {
            return crate::server::not_etcd_api(config.endpoints(), err);
        }
    }
    if matches!(
        crate::error::kind_of(&err),
        ErrorKind::PermissionDenied | ErrorKind::InvalidInput
    ) {
        return into_error(err, what);
    }
    match crate::server::not_etcd(config.endpoints(), config.connect_timeout).await {
        Some(not_etcd) => not_etcd.with_source(err),
        None => into_error(err, what),
    }
}

/// How many etcd keys one page of a listing reads.
const LIST_PAGE: i64 = 1000;

/// How many owner leases a listing reads at once.
const LEASE_READS_AT_ONCE: usize = 16;

/// Where a listing's range read is: the next page starts at `from`, and is read at
/// `revision` (0 before the first page, which sets it).
struct Pages {
    from: Vec<u8>,
    end: Vec<u8>,
    revision: i64,
    /// Whether there is a next page.
    more: bool,
}

impl Pages {
    /// The pages of the range of keys starting with `start`.
    fn new(start: Vec<u8>) -> Self {
        Pages {
            end: range_end(&start),
            from: start,
            revision: 0,
            more: true,
        }
    }
}

/// Adds a page's `entries` to `dirs`, the directories of the listing so far: a page goes
/// on where the previous one stopped, so an entry belongs to the last directory or starts
/// the next. A directory outside `prefix`, or not of a valid key, gets no key.
fn add_to_dirs(keys: &KeySpace, prefix: &str, entries: Vec<KeyValue>, dirs: &mut Vec<Dir>) {
    for entry in entries {
        let Some((dir, key)) = keys.dir_of(entry.key()) else {
            continue;
        };
        match dirs.last_mut() {
            Some(last) if last.dir == dir => last.add(entry),
            _ => {
                let key = LockKey::new(&key)
                    .ok()
                    .filter(|key| key.as_str().starts_with(prefix));
                dirs.push(Dir::new(dir.to_vec(), key, entry));
            }
        }
    }
}

/// One directory met in a listing: its user key (`None` when it is not listed: outside the
/// prefix, or not a valid key), its oldest entry and how many it has.
struct Dir {
    dir: Vec<u8>,
    key: Option<LockKey>,
    owner: KeyValue,
    entries: usize,
}

impl Dir {
    fn new(dir: Vec<u8>, key: Option<LockKey>, first: KeyValue) -> Self {
        Dir {
            dir,
            key,
            owner: first,
            entries: 1,
        }
    }

    fn add(&mut self, entry: KeyValue) {
        self.entries += 1;
        if entry.create_revision() < self.owner.create_revision() {
            self.owner = entry;
        }
    }
}

/// What `inspect` tells of a directory whose oldest entry is `owner`, of `entries` in
/// all, whose lease has `left` seconds (negative: gone); `None` when it is free.
fn holder_info(owner: &KeyValue, entries: usize, left: i64) -> Option<HolderInfo> {
    if left < 0 {
        return None;
    }
    let (lease_id, holder) = parse_value(owner.value())
        // An entry of etcd's own mutex: its etcd lease is the closest to an identity.
        .unwrap_or((LeaseId::from_u128(owner.lease() as u128), None));
    Some(HolderInfo {
        lease_id,
        token: FencingToken::new(u64::try_from(owner.create_revision()).unwrap_or(0)),
        remaining_ttl: Duration::from_secs(u64::try_from(left).unwrap_or(0)),
        waiters: Some(entries.saturating_sub(1)),
        holder,
        kind: lock_core::HoldKind::Mutex,
    })
}

/// Refuses to queue a detached acquisition: nothing would keep its entry while it waits,
/// and the core never asks (a once ticket does not wait).
fn never_queued(request: &AcquireRequest) -> Result<()> {
    if request.is_detached() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "etcd: a detached hold (a once ticket) never waits in a key's queue",
        ));
    }
    Ok(())
}

/// The key-values a transaction's `index`th operation read.
pub(crate) fn read(response: &TxnResponse, index: usize) -> Vec<KeyValue> {
    match response.op_responses().into_iter().nth(index) {
        Some(TxnOpResponse::Get(mut got)) => got.take_kvs(),
        _ => Vec::new(),
    }
}

pub(crate) fn revision_of(response: &TxnResponse) -> i64 {
    response.header().map_or(0, |h| h.revision())
}

/// The transaction of a release: deletes `target`'s entry while it is still the
/// acquisition's, and leaves `tombstones` (with the deletion unless `only_if_absent`, and
/// when the entry is not there). `None` when there is nothing to delete or leave.
fn release_txn(
    target: Option<&(Vec<u8>, Compare)>,
    only_if_absent: bool,
    tombstones: &[TxnOp],
) -> Option<Txn> {
    match target {
        Some((entry, still_ours)) => {
            let mut then = vec![TxnOp::delete(entry.clone(), None)];
            if !only_if_absent {
                then.extend_from_slice(tombstones);
            }
            Some(
                Txn::new()
                    .when([still_ours.clone()])
                    .and_then(then)
                    .or_else(tombstones.to_vec()),
            )
        }
        None if tombstones.is_empty() => None,
        None => Some(Txn::new().and_then(tombstones.to_vec())),
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        if request.key().primitive() != Primitive::Mutex {
            return self.try_acquire_shared(request).await;
        }
        let attempt = self.attempt(request).await?;
        // Free only when nobody holds or queues: a try never jumps the queue. Never after
        // this acquisition's clean-up (a late write; see `retired.rs`).
        let txn = Txn::new()
            .when([
                Compare::create_revision(attempt.dir.clone(), CompareOp::Equal, 0)
                    .with_range(range_end(&attempt.dir)),
                self.not_retired(request, &attempt),
            ])
            .and_then([self.put_entry(request, &attempt)])
            .or_else([
                TxnOp::get(attempt.entry.clone(), None),
                Self::queue(&attempt.dir, 1),
            ]);
        // A detached hold's late write carries its own lease, which its release revokes:
        // no tombstone is needed to keep it out (see `retired.rs`).
        let sending = (!attempt.detached).then(|| {
            self.inner
                .attempts
                .sending(request.lease_id(), &attempt.session)
        });
        let response = self
            .txn_in("acquiring", &attempt.session, txn, sending)
            .await?;
        if response.succeeded() {
            // The entry was created by this transaction, at its revision.
            return Self::grant(revision_of(&response), &attempt).map(Some);
        }
        let own = read(&response, 0);
        let owner = read(&response, 1);
        match (own.first(), owner.first()) {
            // A retry whose first reply was lost: the same entry, the same token.
            (Some(own), Some(owner)) if own.key() == owner.key() => {
                if attempt.detached && own.lease() != attempt.session.lease {
                    // On the lease of an earlier attempt this client no longer knows: the
                    // entry moves to this attempt's, whose TTL counts from this attempt
                    // as the core's deadline does.
                    let txn = self.move_txn(request.key(), own, attempt.session.lease);
                    if !self
                        .call("acquiring", self.kv().txn(txn))
                        .await?
                        .succeeded()
                    {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            "etcd: a retried acquisition's entry changed as it moved; retrying",
                        ));
                    }
                }
                Self::grant(own.create_revision(), &attempt).map(Some)
            }
            (Some(_), _) => Ok(None),
            (None, _) if attempt.detached => {
                let detached = &self.inner.detached;
                detached.end_in_background(request.lease_id(), attempt.session);
                Ok(None)
            }
            (None, _) => {
                self.inner.sessions.end_own(request.lease_id());
                Ok(None)
            }
        }
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let Some(entry) = self.locate(key, lease_id).await? else {
            return Ok(Ownership::NotHeld);
        };
        // A shared key's waiter has an entry too, but holds nothing.
        if key.primitive() != Primitive::Mutex
            && !self.shared_entry_holds(key, lease_id, &entry).await?
        {
            return Ok(Ownership::NotHeld);
        }
        let detached = self.inner.detached.lease_of(lease_id);
        if detached.is_some_and(|lease| lease.lease == entry.lease()) {
            // Nothing keeps a detached hold alive: renewing it sets its end `ttl` from
            // now, as on a store whose leases live by their TTL.
            return self.move_to_new_lease(key, lease_id, &entry, ttl).await;
        }
        let Some(session) = self.inner.sessions.by_lease(entry.lease()) else {
            // Held under a lease of another client instance: keep that lease alive once
            // (opening the stream sends one keep-alive and fails if the lease is gone).
            return match self
                .inner
                .client
                .lease_client()
                .keep_alive(entry.lease())
                .await
            {
                Ok(_) => Ok(Ownership::Held),
                Err(err) if is_lease_not_found(&err) => Ok(Ownership::NotHeld),
                Err(err) => Err(into_error(err, "keeping a lease alive")),
            };
        };
        let session_ttl = session.keeper.status().ttl;
        if ttl > session_ttl {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "etcd keeps a lease for the TTL it was granted with ({session_ttl:?}); \
                     it cannot be renewed for longer ({ttl:?})"
                ),
            ));
        }
        self.inner
            .sessions
            .ping(&session)
            .await
            .map(Ownership::held_if)
    }

    /// Moves the hold to a new etcd lease of `ttl` (whole seconds, rounded up) in one
    /// fenced transaction that keeps its fencing token, then revokes its former lease if it
    /// was the hold's own (see *Once tickets* in the crate docs).
    async fn expire_in(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl: Duration,
    ) -> Result<Ownership> {
        let Some(entry) = self.locate(key, lease_id).await? else {
            return Ok(Ownership::NotHeld);
        };
        self.move_to_new_lease(key, lease_id, &entry, ttl).await
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        if let Some(lease) = self.inner.detached.lease_of(lease_id) {
            return self.release_detached(key, lease_id, &lease).await;
        }
        // A lock with a lease of its own goes with its lease: one write, not two.
        match self.inner.sessions.revoke_own(lease_id).await {
            Some(revoked) => revoked.map(Ownership::held_if),
            None => {
                let deleted = self.delete_entry(key, lease_id).await?;
                self.forget_marker(key, lease_id).await?;
                Ok(deleted)
            }
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        if key.primitive() != Primitive::Mutex {
            return Ok(self.holders_shared(key).await?.into_iter().next());
        }
        let dir = self.inner.keys.dir(key);
        let options = GetOptions::new()
            .with_range(range_end(&dir))
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut found = self
            .call("inspecting", self.kv().get(dir, Some(options)))
            .await?;
        let entries = found.take_kvs();
        let Some(owner) = entries.first() else {
            return Ok(None);
        };
        let left = self.lease_left(owner.lease()).await?;
        Ok(holder_info(owner, entries.len(), left))
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        if key.primitive() != Primitive::Mutex {
            return self.holders_shared(key).await;
        }
        Ok(self.inspect(key).await?.into_iter().collect())
    }

    /// User keys starting with `key_prefix` that have entries left in etcd (holders or
    /// waiters) in any primitive's directories, read together in one transaction.
    async fn stored_keys(&self, key_prefix: &str) -> Result<Vec<String>> {
        let keys = &self.inner.keys;
        // The mutexes' root, the shared primitives' roots, the grant markers' root.
        let roots = [
            keys.root(),
            keys.primitive_root(Primitive::Semaphore),
            keys.primitive_root(Primitive::RwLock),
            keys.markers_root(),
        ];
        let reads = roots.clone().map(|root| {
            let start = keys.starting_with(root, key_prefix);
            let options = GetOptions::new()
                .with_range(range_end(&start))
                .with_keys_only();
            TxnOp::get(start, Some(options))
        });
        let found = self
            .call("listing keys", self.kv().txn(Txn::new().and_then(reads)))
            .await?;
        let mut keys: Vec<String> = roots
            .iter()
            .enumerate()
            .flat_map(|(at, root)| {
                read(&found, at).into_iter().filter_map(move |kv| match at {
                    0 => keys.user_key(kv.key()),
                    _ => keys.user_key_under(root, kv.key()),
                })
            })
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// One linearizable range read over the directories of the keys starting with
    /// `prefix` (in pages of one revision), then the remaining TTL of each distinct owner
    /// lease, read as `inspect` reads it.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        let mut held = Vec::new();
        if limit == 0 {
            return Ok(held);
        }
        let keys = &self.inner.keys;
        // In the distlock layout the directories come in the user keys' order (hex keeps
        // byte order, and `/` sorts before every hex digit, so `a/` before `ab/`), and
        // the scan can stop at `limit`. etcd's mutex names do not (`a!/` sorts before
        // `a/`): every directory is read, then sorted.
        let in_key_order = keys.layout() == Layout::Distlock;
        let mut dirs: Vec<Dir> = Vec::new();
        let mut pages = Pages::new(keys.dirs_starting_with(prefix));
        while let Some(entries) = self.next_page(&mut pages).await? {
            add_to_dirs(keys, prefix, entries, &mut dirs);
            if in_key_order {
                // The last directory may go on in the next page.
                let complete = if pages.more {
                    dirs.len().saturating_sub(1)
                } else {
                    dirs.len()
                };
                let ready: Vec<Dir> = dirs.drain(..complete).collect();
                self.add_held(ready, limit, &mut held).await?;
                if held.len() >= limit {
                    break;
                }
            }
        }
        if !in_key_order {
            dirs.retain(|dir| dir.key.is_some());
            dirs.sort_by(|a, b| a.key.cmp(&b.key));
            self.add_held(dirs, limit, &mut held).await?;
        }
        Ok(held)
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        let dir = self.inner.keys.dir(key);
        let watch = DirWatch::start(&self.inner.client, dir, self.inner.request_timeout).await?;
        Ok(Some(Box::new(watch)))
    }

    async fn enqueue(&self, request: &AcquireRequest) -> Result<()> {
        never_queued(request)?;
        if request.key().primitive() != Primitive::Mutex {
            return self.enqueue_shared(request).await;
        }
        let attempt = self.attempt(request).await?;
        // Idempotent: a retry finds its entry and keeps its place. Never after this
        // acquisition's clean-up (a late write; see `retired.rs`).
        let tombstone = self.not_retired(request, &attempt);
        let txn = Txn::new()
            .when([
                Compare::create_revision(attempt.entry.clone(), CompareOp::Equal, 0),
                tombstone,
            ])
            .and_then([self.put_entry(request, &attempt)])
            .or_else([TxnOp::get(
                self.inner
                    .keys
                    .tombstone(attempt.session.lease, request.lease_id()),
                Some(GetOptions::new().with_keys_only()),
            )]);
        let sending = self
            .inner
            .attempts
            .sending(request.lease_id(), &attempt.session);
        let response = self
            .txn_in("queueing", &attempt.session, txn, Some(sending))
            .await?;
        if !response.succeeded() && !read(&response, 0).is_empty() {
            return Err(Error::new(
                ErrorKind::Internal,
                "etcd: this acquisition was cleaned up before its request reached the store; \
                 nothing was queued",
            ));
        }
        Ok(())
    }

    async fn try_acquire_queued(&self, request: &AcquireRequest) -> Result<Turn> {
        never_queued(request)?;
        if request.key().primitive() != Primitive::Mutex {
            return self.try_acquire_queued_shared(request).await;
        }
        let attempt = self.attempt(request).await?;
        // Only a live entry may be granted (etcd issue 11456): the entry must exist in the
        // same transaction that finds it first, and it exists only while its lease does.
        let txn = Txn::new()
            .when([Compare::create_revision(
                attempt.entry.clone(),
                CompareOp::Greater,
                0,
            )])
            .and_then([Self::queue(&attempt.dir, 1)]);
        let mut kv = self.kv();
        let looked = self.call("acquiring", kv.txn(txn));
        let kept = self.keep_waiter_alive(request, &attempt);
        let (response, kept) = tokio::join!(looked, kept);
        let response = response?;
        kept?;
        if !response.succeeded() {
            return Ok(Turn::NotQueued);
        }
        match read(&response, 0).first() {
            Some(owner) if owner.key() == attempt.entry.as_slice() => Ok(Turn::Granted(
                Self::grant(owner.create_revision(), &attempt)?,
            )),
            _ => Ok(Turn::Waiting),
        }
    }

    async fn leave_queue(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        match self.inner.sessions.revoke_own(lease_id).await {
            Some(revoked) => revoked.map(drop),
            None => {
                self.delete_entry(key, lease_id).await.map(drop)?;
                self.forget_marker(key, lease_id).await
            }
        }
    }

    async fn watch_turn(&self, request: &AcquireRequest) -> Result<Option<Box<dyn KeyWatch>>> {
        if request.key().primitive() != Primitive::Mutex {
            return Ok(Some(self.watch_turn_shared(request)));
        }
        let keys = &self.inner.keys;
        let own = match keys.known_entry(request.key(), request.lease_id()) {
            Some(entry) => Own::Entry(entry),
            None => Own::Value(request.lease_id()),
        };
        Ok(Some(Box::new(TurnWatch::new(
            self.inner.client.clone(),
            keys.dir(request.key()),
            own,
            self.inner.request_timeout,
        ))))
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        let mut found = self
            .call(
                "reading a record",
                self.kv().get(self.inner.keys.record(key), None),
            )
            .await?;
        Ok(found
            .take_kvs()
            .first()
            .and_then(|kv| Record::from_bytes(kv.value())))
    }

    /// Fenced in one transaction: the record is written only if the caller's entry exists
    /// (so its etcd lease is alive) with the create revision the record's token names,
    /// and no entry of the key's directory is older (so it is still the owner). In the
    /// distlock layout the entry's name follows from the lease id, so that transaction is
    /// the write's only round trip once the record lease is there (see `records.rs`).
    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        let Ok(granted) = i64::try_from(record.token.get()) else {
            return Ok(Ownership::NotHeld);
        };
        let entry = match self.inner.keys.known_entry(key, lease_id) {
            Some(entry) => entry,
            // The etcd-mutex layout names entries by their session's lease: searched for.
            None => match self.locate(key, lease_id).await? {
                Some(kv) if kv.create_revision() == granted => kv.key().to_vec(),
                _ => return Ok(Ownership::NotHeld),
            },
        };
        // Whole seconds, rounded up (at most thirty years: no overflow).
        let seconds = (Record::retention_millis(retention)? + 999) / 1000;
        let dir = self.inner.keys.dir(key);
        let fenced = [
            Compare::create_revision(entry, CompareOp::Equal, granted),
            Compare::create_revision(dir.clone(), CompareOp::Greater, granted - 1)
                .with_range(range_end(&dir)),
        ];
        let record_key = self.inner.keys.record(key);
        // A lease etcd lost is replaced once; a second loss in a row is an error.
        let mut replaced = false;
        loop {
            let lease = self.record_lease(seconds).await?;
            let txn = Txn::new().when(fenced.clone()).and_then([TxnOp::put(
                record_key.clone(),
                record.to_bytes(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
            let what = "writing a record";
            let sent = with_timeout("etcd", self.inner.request_timeout, what, async {
                Ok(self.kv().txn(txn).await)
            })
            .await?;
            match sent {
                Ok(written) => return Ok(Ownership::held_if(written.succeeded())),
                Err(err) if is_lease_not_found(&err) && !replaced => {
                    self.inner.records.gone(seconds, lease);
                    replaced = true;
                }
                Err(err) => return Err(into_error(err, what)),
            }
        }
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .field("keys", &self.inner.keys)
            .finish_non_exhaustive()
    }
}
