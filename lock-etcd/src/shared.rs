//! Semaphores and reader-writer locks: shared holds in a fair queue, the mutex's way.
//!
//! Each holder and each waiter of a shared key is one entry in the key's directory (under
//! its primitive's root, see `keys.rs`), on its session's etcd lease, named after its
//! lease id in its kind's part of the directory (`<limit>/`, `read/`, `write/`), its value
//! a state line (`queued` or `held`) and the lease id and label. The queue is the
//! directory in create-revision order, and a waiter's turn comes by the rank rules of the
//! core's *Shared holds*: a permit when fewer than `limit` entries are ahead of it, a read
//! when no write entry is ahead of it, a write when it is first. Entries ahead of one only
//! ever leave (new ones are created behind it), so a turn once come stays.
//!
//! Every grant is a write: an unqueued try creates its entry `held`, a waiter whose turn
//! came rewrites its entry `held` (a put keeps the create revision, so it keeps its
//! place). The token is that write's revision, the entry's mod revision from then on:
//! above every token granted before for the key, whichever waiter comes back first.
//!
//! The etcd-mutex layout keeps reader-writer locks as etcd's Go `recipe.RWMutex` does
//! (`<name>/read/…`, `<name>/write/…`, never rewritten: the recipe orders entries by mod
//! revision), so there a grant is marked apart: a key `<prefix>#granted/<name>/<lease id>`
//! on the entry's etcd lease, put by the grant (its revision the token) and gone with the
//! entry's lease. The recipe's own entries hold by the rank rules alone.

use std::collections::HashMap;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse,
};
use lock_core::backend::{AcquireRequest, Grant, HolderInfo, KeyWatch, Turn};
use lock_core::{Error, ErrorKind, FencingToken, HoldKind, LeaseId, LockKey, Result};

use crate::backend::{read, revision_of, Attempt, EtcdBackend};
use crate::config::Layout;
use crate::keys::{is_held, kind_of, parse_value, part, range_end, shared_value, value};
use crate::watch::ShareWatch;

impl EtcdBackend {
    /// An unqueued attempt at a shared hold: granted only when the entry, put at the end
    /// of the queue, would be granted at once, so it never jumps the queue.
    pub(crate) async fn try_acquire_shared(
        &self,
        request: &AcquireRequest,
    ) -> Result<Option<Grant>> {
        never_detached(request)?;
        let attempt = self.attempt(request).await?;
        match request.key().kind() {
            HoldKind::Permit { limit } => self.try_permit(request, &attempt, limit).await,
            kind => self.try_read_or_write(request, &attempt, kind).await,
        }
    }

    /// A read when no writer holds or waits, a write when nobody holds or waits: one
    /// transaction, the condition its compares.
    async fn try_read_or_write(
        &self,
        request: &AcquireRequest,
        attempt: &Attempt,
        kind: HoldKind,
    ) -> Result<Option<Grant>> {
        let (from, end) = blockers(&attempt.dir, kind);
        let marker = self.marker(request.key(), request.lease_id());
        let mut then = vec![self.put_shared(request, attempt, true)];
        let mut otherwise = vec![TxnOp::get(attempt.entry.clone(), None)];
        if let Some(marker) = &marker {
            then.push(put_marker(marker, attempt.session.lease));
            otherwise.push(TxnOp::get(marker.clone(), None));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(from, CompareOp::Equal, 0).with_range(end),
                // A retry whose first reply was lost keeps its entry and its token.
                Compare::create_revision(attempt.entry.clone(), CompareOp::Equal, 0),
                self.not_retired(request, attempt),
            ])
            .and_then(then)
            .or_else(otherwise);
        let response = self
            .send_acquisition("acquiring", request, attempt, txn)
            .await?;
        if response.succeeded() {
            return Self::grant(revision_of(&response), attempt).map(Some);
        }
        let (own, marked) = (read(&response, 0), read(&response, 1));
        granted_before(own.first(), marked.first(), marker.is_some(), attempt)
    }

    /// A permit when fewer than `limit` entries are in the semaphore's directory: read,
    /// then put the entry if nothing in the directory was written since the read (entries
    /// that left only make room). A write in between means another look.
    async fn try_permit(
        &self,
        request: &AcquireRequest,
        attempt: &Attempt,
        limit: u32,
    ) -> Result<Option<Grant>> {
        let dir = &attempt.dir;
        loop {
            let options = GetOptions::new().with_range(range_end(dir));
            let mut found = self
                .call("acquiring", self.kv().get(dir.clone(), Some(options)))
                .await?;
            let revision = found.header().map_or(0, |h| h.revision());
            let entries = found.take_kvs();
            if let Some(own) = entries
                .iter()
                .find(|kv| kv.key() == attempt.entry.as_slice())
            {
                return granted_before(Some(own), None, false, attempt);
            }
            if let Some(other) = entries.iter().find_map(|kv| other_limit(dir, kv, limit)) {
                return Err(limit_disagreement(request.key(), limit, other));
            }
            if entries.len() >= limit as usize {
                return Ok(None);
            }
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(dir.clone(), CompareOp::Less, revision + 1)
                        .with_range(range_end(dir)),
                    self.not_retired(request, attempt),
                ])
                .and_then([self.put_shared(request, attempt, true)])
                .or_else([TxnOp::get(
                    self.inner
                        .keys
                        .tombstone(attempt.session.lease, request.lease_id()),
                    Some(GetOptions::new().with_keys_only()),
                )]);
            let response = self
                .send_acquisition("acquiring", request, attempt, txn)
                .await?;
            if response.succeeded() {
                return Self::grant(revision_of(&response), attempt).map(Some);
            }
            // Cleaned up already (a late attempt): nothing to grant, and no look again
            // would change that.
            if !read(&response, 0).is_empty() {
                return Ok(None);
            }
        }
    }

    /// Puts a waiter's entry at the end of the queue, once per lease id; a permit only
    /// while no entry of another limit is there (the compares make it atomic).
    pub(crate) async fn enqueue_shared(&self, request: &AcquireRequest) -> Result<()> {
        let attempt = self.attempt(request).await?;
        let mut when = vec![
            Compare::create_revision(attempt.entry.clone(), CompareOp::Equal, 0),
            self.not_retired(request, &attempt),
        ];
        let keys_only = GetOptions::new().with_keys_only();
        let tombstone = self
            .inner
            .keys
            .tombstone(attempt.session.lease, request.lease_id());
        let mut otherwise = vec![
            TxnOp::get(attempt.entry.clone(), Some(keys_only.clone())),
            TxnOp::get(tombstone, Some(keys_only)),
        ];
        let limit = match request.key().kind() {
            HoldKind::Permit { limit } => Some(limit),
            _ => None,
        };
        if let Some(limit) = limit {
            for (from, end) in other_limits(&attempt.dir, limit) {
                when.push(
                    Compare::create_revision(from.clone(), CompareOp::Equal, 0)
                        .with_range(end.clone()),
                );
                let one = GetOptions::new()
                    .with_range(end)
                    .with_keys_only()
                    .with_limit(1);
                otherwise.push(TxnOp::get(from, Some(one)));
            }
        }
        let txn = Txn::new()
            .when(when)
            .and_then([self.put_shared(request, &attempt, false)])
            .or_else(otherwise);
        let response = self
            .send_acquisition("queueing", request, &attempt, txn)
            .await?;
        // Queued now, or by an earlier try whose reply was lost: it keeps its place.
        if response.succeeded() || !read(&response, 0).is_empty() {
            return Ok(());
        }
        if !read(&response, 1).is_empty() {
            return Err(Error::new(
                ErrorKind::Internal,
                "etcd: this acquisition was cleaned up before its request reached the store; \
                 nothing was queued",
            ));
        }
        let other = (2..4).find_map(|at| {
            let found = read(&response, at);
            found
                .first()
                .and_then(|kv| limit.and_then(|limit| other_limit(&attempt.dir, kv, limit)))
        });
        match (limit, other) {
            (Some(limit), Some(other)) => Err(limit_disagreement(request.key(), limit, other)),
            // The reads are of the revision the compares failed at, so only an entry that is
            // not distlock's (a name of no limit) gets here.
            _ => Err(Error::new(
                ErrorKind::Unavailable,
                "etcd: the queue changed while queueing; retrying",
            )),
        }
    }

    /// A queued waiter's attempt: granted when its entry is live and its turn has come by
    /// the rank rules; the grant rewrites the entry `held`.
    pub(crate) async fn try_acquire_queued_shared(&self, request: &AcquireRequest) -> Result<Turn> {
        let attempt = self.attempt(request).await?;
        let (turn, kept) = tokio::join!(
            self.take_turn(request, &attempt),
            self.keep_waiter_alive(request, &attempt)
        );
        kept?;
        turn
    }

    async fn take_turn(&self, request: &AcquireRequest, attempt: &Attempt) -> Result<Turn> {
        let kind = request.key().kind();
        let dir = &attempt.dir;
        let sorted = |from: Vec<u8>, limit: i64| {
            let options = GetOptions::new()
                .with_range(range_end(&from))
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_keys_only()
                .with_limit(limit);
            TxnOp::get(from, Some(options))
        };
        // The entries that decide the turn: the first `limit` of a semaphore, the first
        // writer for a read, the first entry for a write.
        let ahead = match kind {
            HoldKind::Permit { limit } => sorted(dir.clone(), i64::from(limit)),
            HoldKind::Read => sorted(part(dir, HoldKind::Write), 1),
            _ => sorted(dir.clone(), 1),
        };
        let marker = self.marker(request.key(), request.lease_id());
        let mut look = vec![TxnOp::get(attempt.entry.clone(), None), ahead];
        if let Some(marker) = &marker {
            look.push(TxnOp::get(marker.clone(), None));
        }
        loop {
            // Only a live entry may be granted (etcd issue 11456, as for the mutex).
            let txn = Txn::new()
                .when([Compare::create_revision(
                    attempt.entry.clone(),
                    CompareOp::Greater,
                    0,
                )])
                .and_then(look.clone());
            let response = self.call("acquiring", self.kv().txn(txn)).await?;
            let Some(own) = read(&response, 0).into_iter().next() else {
                return Ok(Turn::NotQueued);
            };
            let marked = read(&response, 2);
            if let Some(token) = token_of(&own, marked.first(), marker.is_some()) {
                return Ok(Turn::Granted(Self::grant(token, attempt)?));
            }
            let ahead = read(&response, 1);
            let my_turn = match kind {
                HoldKind::Permit { .. } => ahead.iter().any(|kv| kv.key() == own.key()),
                HoldKind::Read => ahead
                    .first()
                    .is_none_or(|writer| writer.create_revision() > own.create_revision()),
                _ => ahead.first().is_some_and(|first| first.key() == own.key()),
            };
            if !my_turn {
                return Ok(Turn::Waiting);
            }
            // The grant is a write, so its revision (the token) is above every grant
            // before it; only of the entry as read, still queued.
            let same_entry = Compare::create_revision(
                own.key().to_vec(),
                CompareOp::Equal,
                own.create_revision(),
            );
            let txn = match &marker {
                Some(marker) => Txn::new()
                    .when([
                        same_entry,
                        Compare::create_revision(marker.clone(), CompareOp::Equal, 0),
                    ])
                    .and_then([put_marker(marker, own.lease())]),
                None => Txn::new()
                    .when([
                        same_entry,
                        Compare::mod_revision(
                            own.key().to_vec(),
                            CompareOp::Equal,
                            own.mod_revision(),
                        ),
                    ])
                    .and_then([TxnOp::put(
                        own.key().to_vec(),
                        shared_value(true, request.lease_id(), request.holder_label()),
                        Some(PutOptions::new().with_lease(own.lease())),
                    )]),
            };
            let granted = self
                .txn_in("acquiring", &attempt.session, txn, None)
                .await?;
            if granted.succeeded() {
                return Ok(Turn::Granted(Self::grant(revision_of(&granted), attempt)?));
            }
            // Granted by an attempt whose reply was lost, or gone: look again.
        }
    }

    /// Wakes a shared key's waiter when entries ahead of it that stand in its way leave.
    pub(crate) fn watch_turn_shared(&self, request: &AcquireRequest) -> Box<dyn KeyWatch> {
        let keys = &self.inner.keys;
        let key = request.key();
        Box::new(ShareWatch::new(
            self.inner.client.clone(),
            keys.dir(key),
            keys.entry(key, request.lease_id(), 0),
            key.kind(),
            self.inner.request_timeout,
        ))
    }

    /// Every live holder of a shared key, oldest grant (lowest token) first, read with
    /// the key's grant markers in one transaction.
    pub(crate) async fn holders_shared(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        let keys = &self.inner.keys;
        let (dir, markers) = (keys.dir(key), keys.markers(key));
        let range = |from: &[u8]| {
            let options = GetOptions::new()
                .with_range(range_end(from))
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            TxnOp::get(from.to_vec(), Some(options))
        };
        let txn = Txn::new().and_then([range(&dir), range(&markers)]);
        let found = self.call("reading holders", self.kv().txn(txn)).await?;
        let (entries, marked) = (read(&found, 0), read(&found, 1));
        let held = match keys.layout() {
            Layout::Distlock => entries
                .iter()
                .filter(|kv| is_held(kv.value()))
                .map(|kv| (kv, kv.mod_revision()))
                .collect(),
            Layout::EtcdMutex => held_apart(&dir, &entries, &markers, &marked),
        };
        self.holder_infos(&dir, held, entries.len()).await
    }

    /// The holders' infos, their tokens given, in token order; `entries` in the directory
    /// in all (the others wait). Each distinct etcd lease's TTL is read once; an entry
    /// whose lease is gone holds nothing.
    async fn holder_infos(
        &self,
        dir: &[u8],
        mut held: Vec<(&KeyValue, i64)>,
        entries: usize,
    ) -> Result<Vec<HolderInfo>> {
        held.sort_by_key(|(_, token)| *token);
        let waiters = entries - held.len();
        let mut left: HashMap<i64, i64> = HashMap::new();
        let mut holders = Vec::with_capacity(held.len());
        for (entry, token) in held {
            let seconds = match left.get(&entry.lease()) {
                Some(seconds) => *seconds,
                None => {
                    let seconds = self.lease_left(entry.lease()).await?;
                    left.insert(entry.lease(), seconds);
                    seconds
                }
            };
            let Some(kind) = entry.key().strip_prefix(dir).and_then(kind_of) else {
                continue;
            };
            if seconds < 0 {
                continue;
            }
            let (lease_id, holder) = parse_value(entry.value())
                // An entry of etcd's Go recipe: its etcd lease is the closest to an identity.
                .unwrap_or((LeaseId::from_u128(entry.lease() as u128), None));
            holders.push(HolderInfo {
                lease_id,
                token: FencingToken::new(u64::try_from(token).unwrap_or(0)),
                remaining_ttl: std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
                waiters: Some(waiters),
                holder,
                kind,
            });
        }
        Ok(holders)
    }

    /// A shared entry put with the session's lease, `held` or queued (in the etcd-mutex
    /// layout without a state line: its grant is marked apart).
    fn put_shared(&self, request: &AcquireRequest, attempt: &Attempt, held: bool) -> TxnOp {
        let (lease_id, label) = (request.lease_id(), request.holder_label());
        let value = match self.inner.keys.layout() {
            Layout::Distlock => shared_value(held, lease_id, label),
            Layout::EtcdMutex => value(lease_id, label),
        };
        TxnOp::put(
            attempt.entry.clone(),
            value,
            Some(PutOptions::new().with_lease(attempt.session.lease)),
        )
    }

    /// Where the grant of `lease_id`'s hold of `key` is marked when its entry is never
    /// rewritten (the etcd-mutex layout's reader-writer lock); `None` in the distlock
    /// layout, where the entry says it.
    fn marker(&self, key: &LockKey, lease_id: LeaseId) -> Option<Vec<u8>> {
        let keys = &self.inner.keys;
        (keys.layout() == Layout::EtcdMutex).then(|| keys.marker(key, lease_id))
    }

    /// Whether the shared hold `lease_id` of `key`, whose entry was read as `entry`, is
    /// granted (rather than queued).
    pub(crate) async fn shared_entry_holds(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        entry: &KeyValue,
    ) -> Result<bool> {
        let Some(marker) = self.marker(key, lease_id) else {
            return Ok(is_held(entry.value()));
        };
        let options = GetOptions::new().with_keys_only();
        let found = self
            .call("reading a grant", self.kv().get(marker, Some(options)))
            .await?;
        Ok(!found.kvs().is_empty())
    }

    /// Deletes the grant marker of `lease_id`'s hold of `key`, if the layout has one: a
    /// release that deleted the entry by name leaves the marker on a lease that lives on.
    pub(crate) async fn forget_marker(&self, key: &LockKey, lease_id: LeaseId) -> Result<()> {
        if key.primitive() == lock_core::Primitive::Mutex {
            return Ok(());
        }
        if let Some(marker) = self.marker(key, lease_id) {
            self.call("releasing", self.kv().delete(marker, None))
                .await?;
        }
        Ok(())
    }

    /// Sends an acquisition's write, recorded as on its way until etcd answers (see
    /// `retired.rs`).
    async fn send_acquisition(
        &self,
        what: &str,
        request: &AcquireRequest,
        attempt: &Attempt,
        txn: Txn,
    ) -> Result<TxnResponse> {
        let sending = self
            .inner
            .attempts
            .sending(request.lease_id(), &attempt.session);
        self.txn_in(what, &attempt.session, txn, Some(sending))
            .await
    }
}

/// The range whose entries make an unqueued `kind` wait: the writers for a read, every
/// entry for the others.
fn blockers(dir: &[u8], kind: HoldKind) -> (Vec<u8>, Vec<u8>) {
    let from = match kind {
        HoldKind::Read => part(dir, HoldKind::Write),
        _ => dir.to_vec(),
    };
    let end = range_end(&from);
    (from, end)
}

/// The two ranges of a semaphore's directory outside its entries of `limit`.
fn other_limits(dir: &[u8], limit: u32) -> [(Vec<u8>, Vec<u8>); 2] {
    let own = part(dir, HoldKind::Permit { limit });
    [
        (dir.to_vec(), own.clone()),
        (range_end(&own), range_end(dir)),
    ]
}

/// The limit of a semaphore entry asked with another limit than `limit`.
fn other_limit(dir: &[u8], entry: &KeyValue, limit: u32) -> Option<u32> {
    match entry.key().strip_prefix(dir).and_then(kind_of) {
        Some(HoldKind::Permit { limit: other }) if other != limit => Some(other),
        _ => None,
    }
}

fn limit_disagreement(key: &LockKey, asked: u32, other: u32) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!(
            "semaphore {:?} asked with a limit of {asked}, but it is held or awaited with a \
             limit of {other}; its limit changes only once nobody holds or waits for it",
            key.as_str()
        ),
    )
}

/// The grant of an earlier attempt whose reply was lost: its entry `own`, if it holds
/// (with its grant `marker`, when marked `apart`).
fn granted_before(
    own: Option<&KeyValue>,
    marker: Option<&KeyValue>,
    apart: bool,
    attempt: &Attempt,
) -> Result<Option<Grant>> {
    match own.and_then(|own| token_of(own, marker, apart)) {
        Some(token) => EtcdBackend::grant(token, attempt).map(Some),
        None => Ok(None),
    }
}

/// The token of the hold whose entry is `own`, if it is granted: its mod revision once
/// rewritten `held`, or, marked `apart`, its grant `marker`'s revision.
fn token_of(own: &KeyValue, marker: Option<&KeyValue>, apart: bool) -> Option<i64> {
    if apart {
        marker.map(KeyValue::create_revision)
    } else {
        is_held(own.value()).then(|| own.mod_revision())
    }
}

/// The put of a grant marker on etcd lease `lease` (the entry's).
fn put_marker(marker: &[u8], lease: i64) -> TxnOp {
    TxnOp::put(
        marker.to_vec(),
        "",
        Some(PutOptions::new().with_lease(lease)),
    )
}

/// Semaphores and reader-writer locks live by the client's sessions: a detached hold (a
/// once ticket) is a mutex's, and the core never asks for another.
fn never_detached(request: &AcquireRequest) -> Result<()> {
    if request.is_detached() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "etcd: only a mutex can be a detached hold (a once ticket)",
        ));
    }
    Ok(())
}

/// The holders of an etcd-mutex layout reader-writer lock whose `entries` (in create
/// order) are in `dir` and grant markers (`marked`) in `markers`, with their tokens:
/// distlock's entries hold when marked (the marker's revision the token), the Go recipe's
/// by the rank rules (a read with no write entry ahead, a write first; its create
/// revision the token).
fn held_apart<'e>(
    dir: &[u8],
    entries: &'e [KeyValue],
    markers: &[u8],
    marked: &[KeyValue],
) -> Vec<(&'e KeyValue, i64)> {
    let marks: HashMap<&[u8], i64> = marked
        .iter()
        .filter_map(|kv| Some((kv.key().strip_prefix(markers)?, kv.create_revision())))
        .collect();
    let mut writer_ahead = false;
    let mut held = Vec::new();
    for (at, entry) in entries.iter().enumerate() {
        let kind = entry.key().strip_prefix(dir).and_then(kind_of);
        let token = match parse_value(entry.value()) {
            Some((lease_id, _)) => marks.get(lease_id.to_string().as_bytes()).copied(),
            None => match kind {
                Some(HoldKind::Read) if !writer_ahead => Some(entry.create_revision()),
                Some(HoldKind::Write) if at == 0 => Some(entry.create_revision()),
                _ => None,
            },
        };
        writer_ahead |= kind == Some(HoldKind::Write);
        if let Some(token) = token {
            held.push((entry, token));
        }
    }
    held
}
