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
//! Every grant is a write in the directory: an unqueued try creates its entry `held`, a
//! waiter whose turn came rewrites its entry `held` (a put keeps the create revision, so
//! it keeps its place). The token is that write's revision, the entry's mod revision from
//! then on: above every token granted before for the key, whichever waiter comes back
//! first.

use std::collections::{HashMap, HashSet};

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse,
};
use lock_core::backend::{AcquireRequest, Grant, HolderInfo, KeyWatch, Turn};
use lock_core::{Error, ErrorKind, FencingToken, HoldKind, LockKey, Result};

use crate::backend::{read, revision_of, Attempt, EtcdBackend};
use crate::keys::{is_held, kind_of, kind_part, parse_value, range_end, shared_value};
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
        let txn = Txn::new()
            .when([
                Compare::create_revision(from, CompareOp::Equal, 0).with_range(end),
                // A retry whose first reply was lost keeps its entry and its token.
                Compare::create_revision(attempt.entry.clone(), CompareOp::Equal, 0),
                self.not_retired(request, attempt),
            ])
            .and_then([self.put_shared(request, attempt, true)])
            .or_else([TxnOp::get(attempt.entry.clone(), None)]);
        let response = self
            .send_acquisition("acquiring", request, attempt, txn)
            .await?;
        if response.succeeded() {
            return Self::grant(revision_of(&response), attempt).map(Some);
        }
        granted_before(read(&response, 0).first(), attempt)
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
                return granted_before(Some(own), attempt);
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
                .and_then([self.put_shared(request, attempt, true)]);
            let response = self
                .send_acquisition("acquiring", request, attempt, txn)
                .await?;
            if response.succeeded() {
                return Self::grant(revision_of(&response), attempt).map(Some);
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
            // Only when the other entry left between the compare and the read.
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
        loop {
            // Only a live entry may be granted (etcd issue 11456, as for the mutex).
            let txn = Txn::new()
                .when([Compare::create_revision(
                    attempt.entry.clone(),
                    CompareOp::Greater,
                    0,
                )])
                .and_then([TxnOp::get(attempt.entry.clone(), None), ahead.clone()]);
            let response = self.call("acquiring", self.kv().txn(txn)).await?;
            let Some(own) = read(&response, 0).into_iter().next() else {
                return Ok(Turn::NotQueued);
            };
            if is_held(own.value()) {
                return Ok(Turn::Granted(Self::grant(own.mod_revision(), attempt)?));
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
            let txn = Txn::new()
                .when([
                    Compare::create_revision(
                        own.key().to_vec(),
                        CompareOp::Equal,
                        own.create_revision(),
                    ),
                    Compare::mod_revision(own.key().to_vec(), CompareOp::Equal, own.mod_revision()),
                ])
                .and_then([TxnOp::put(
                    own.key().to_vec(),
                    shared_value(true, request.lease_id(), request.holder_label()),
                    Some(PutOptions::new().with_lease(own.lease())),
                )]);
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

    /// Every live holder of a shared key, oldest grant (lowest token) first.
    pub(crate) async fn holders_shared(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        let dir = self.inner.keys.dir(key);
        let options = GetOptions::new().with_range(range_end(&dir));
        let mut found = self
            .call("reading holders", self.kv().get(dir.clone(), Some(options)))
            .await?;
        let entries = found.take_kvs();
        let waiters = entries.iter().filter(|kv| !is_held(kv.value())).count();
        let mut held: Vec<&KeyValue> = entries.iter().filter(|kv| is_held(kv.value())).collect();
        held.sort_by_key(|kv| kv.mod_revision());
        let mut left: HashMap<i64, i64> = HashMap::new();
        let mut holders = Vec::with_capacity(held.len());
        for entry in held {
            let seconds = match left.get(&entry.lease()) {
                Some(seconds) => *seconds,
                None => {
                    let seconds = self.lease_left(entry.lease()).await?;
                    left.insert(entry.lease(), seconds);
                    seconds
                }
            };
            let (Some((lease_id, holder)), Some(kind)) = (
                parse_value(entry.value()),
                entry.key().strip_prefix(dir.as_slice()).and_then(kind_of),
            ) else {
                continue;
            };
            if seconds < 0 {
                continue;
            }
            holders.push(HolderInfo {
                lease_id,
                token: FencingToken::new(u64::try_from(entry.mod_revision()).unwrap_or(0)),
                remaining_ttl: std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
                waiters: Some(waiters),
                holder,
                kind,
            });
        }
        Ok(holders)
    }

    /// A shared entry put with the session's lease, `held` or queued.
    fn put_shared(&self, request: &AcquireRequest, attempt: &Attempt, held: bool) -> TxnOp {
        TxnOp::put(
            attempt.entry.clone(),
            shared_value(held, request.lease_id(), request.holder_label()),
            Some(PutOptions::new().with_lease(attempt.session.lease)),
        )
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

/// The part of `dir` holding `kind`'s entries.
pub(crate) fn part(dir: &[u8], kind: HoldKind) -> Vec<u8> {
    let mut part = dir.to_vec();
    part.extend_from_slice(&kind_part(kind).unwrap_or_default());
    part
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

/// The grant of an earlier attempt whose reply was lost: its entry, if it holds.
fn granted_before(own: Option<&KeyValue>, attempt: &Attempt) -> Result<Option<Grant>> {
    match own {
        Some(own) if is_held(own.value()) => {
            EtcdBackend::grant(own.mod_revision(), attempt).map(Some)
        }
        _ => Ok(None),
    }
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

/// The keys among `entries` ahead of `own` in a shared queue (sorted by create revision)
/// that stand in its way, and how many of them may stay when its turn comes: for a permit
/// every entry ahead, `limit - 1` staying; for a read the writers ahead, none staying; for
/// a write every entry ahead, none staying. `None` when `own` is not among them.
pub(crate) fn in_the_way(
    dir: &[u8],
    entries: &[KeyValue],
    own: &[u8],
    kind: HoldKind,
) -> Option<(HashSet<Vec<u8>>, usize)> {
    let at = entries.iter().position(|kv| kv.key() == own)?;
    let ahead = entries[..at].iter().map(KeyValue::key);
    Some(match kind {
        HoldKind::Permit { limit } => (
            ahead.map(<[u8]>::to_vec).collect(),
            (limit as usize).saturating_sub(1),
        ),
        HoldKind::Read => {
            let writers = part(dir, HoldKind::Write);
            (
                ahead
                    .filter(|key| key.starts_with(&writers))
                    .map(<[u8]>::to_vec)
                    .collect(),
                0,
            )
        }
        _ => (ahead.map(<[u8]>::to_vec).collect(), 0),
    })
}
