//! Waiting with etcd watches: a queued waiter watches only its predecessor's entry, and
//! checks the entry is still there once the watch is in place, so a deletion in between is
//! never missed.

use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, KeyValue, SortOrder, SortTarget, WatchFilterType, WatchOptions,
    WatchStream,
};
use futures_util::{FutureExt, TryFutureExt};
use lock_core::backend::async_trait;
use lock_core::backend::{with_timeout, Change, KeyWatch};
use lock_core::{LeaseId, Result};

use crate::error::into_error;
use crate::keys::{parse_value, range_end};

/// How a waiter recognises its own entry in the key's directory.
#[derive(Clone, Debug)]
pub(crate) enum Own {
    /// The entry's name (the distlock layout names it after the lease id).
    Entry(Vec<u8>),
    /// The entry whose value carries the lease id (the etcd-mutex layout).
    Value(LeaseId),
}

/// Wakes a queued waiter when its predecessor's entry is deleted (released, left, or
/// expired with its lease). After each wake-up it picks the new predecessor.
pub(crate) struct TurnWatch {
    client: Client,
    dir: Vec<u8>,
    own: Own,
    request_timeout: Duration,
    current: Option<WatchStream>,
}

impl TurnWatch {
    pub(crate) fn new(client: Client, dir: Vec<u8>, own: Own, request_timeout: Duration) -> Self {
        TurnWatch {
            client,
            dir,
            own,
            request_timeout,
            current: None,
        }
    }

    /// Looks at the queue and watches the entry just ahead of ours. `None` when there is
    /// nothing to wait for: our entry is first, or gone, or the predecessor went while the
    /// watch was being set up.
    async fn watch_predecessor(&self) -> Result<Option<WatchStream>> {
        let options = GetOptions::new()
            .with_range(range_end(&self.dir))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        let options = match self.own {
            Own::Entry(_) => options,
            // The value says whose entry it is.
            Own::Value(_) => GetOptions::new()
                .with_range(range_end(&self.dir))
                .with_sort(SortTarget::Create, SortOrder::Ascend),
        };
        let found = self
            .get("looking at the queue", self.dir.clone(), options)
            .await?;
        let revision = found.header().map_or(0, |h| h.revision());
        let position = found.kvs().iter().position(|kv| match &self.own {
            Own::Entry(entry) => kv.key() == entry.as_slice(),
            Own::Value(lease_id) => parse_value(kv.value()).is_some_and(|(id, _)| id == *lease_id),
        });
        let Some(predecessor) = position.filter(|at| *at > 0).map(|at| &found.kvs()[at - 1]) else {
            return Ok(None);
        };
        let (key, created) = (predecessor.key().to_vec(), predecessor.create_revision());
        // Watched from etcd's current revision, not from `revision + 1`: etcd serves a
        // watch that starts in the past ("unsynced") only from a loop that runs every
        // 100 ms, so a release landing before that loop caught up reached the waiter up to
        // 100 ms late, and on a busy key nearly every watch starts in the past.
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let what = "watching the queue";
        let mut stream = with_timeout(
            "etcd",
            self.request_timeout,
            what,
            self.client
                .watch_client()
                .watch(key.clone(), Some(options))
                .map_err(|err| into_error(err, what)),
        )
        .await?;
        // The watch delivers every change after the revision its confirmation carries.
        let confirmed =
            with_timeout("etcd", self.request_timeout, what, stream.message().map(Ok)).await?;
        let watched_from = match confirmed {
            Ok(Some(reply)) if reply.created() && !reply.canceled() => {
                reply.header().map_or(i64::MAX, |h| h.revision())
            }
            // Not confirmed: the caller looks again.
            _ => return Ok(None),
        };
        if watched_from > revision {
            // Something was written between the read and the watch: the predecessor may
            // have gone (or gone and queued again, behind us) in that gap, which the watch
            // would not report. It is still ahead only if this entry is still there, from
            // a read made after the watch was in place.
            let still = self
                .get(
                    "looking at the queue",
                    key,
                    GetOptions::new().with_keys_only(),
                )
                .await?;
            let ahead = still.kvs().first().map(KeyValue::create_revision);
            if ahead != Some(created) {
                return Ok(None);
            }
        }
        Ok(Some(stream))
    }

    async fn get(
        &self,
        what: &str,
        key: Vec<u8>,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse> {
        with_timeout(
            "etcd",
            self.request_timeout,
            what,
            self.client
                .kv_client()
                .get(key, Some(options))
                .map_err(|err| into_error(err, what)),
        )
        .await
    }
}

#[async_trait]
impl KeyWatch for TurnWatch {
    async fn changed(&mut self) -> Result<Change> {
        loop {
            let Some(stream) = self.current.as_mut() else {
                match self.watch_predecessor().await? {
                    Some(stream) => {
                        self.current = Some(stream);
                        continue;
                    }
                    // Our turn may have come (or our entry is gone): look again.
                    None => return Ok(Change::LookAgain),
                }
            };
            match stream.message().await {
                Ok(Some(reply)) if reply.canceled() || reply.compact_revision() > 0 => {
                    // A cancelled or compacted watch may have missed the deletion.
                    self.current = None;
                    return Ok(Change::LookAgain);
                }
                Ok(Some(reply)) => {
                    if reply
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete)
                    {
                        self.current = None;
                        return Ok(Change::Released);
                    }
                }
                Ok(None) | Err(_) => {
                    self.current = None;
                    return Ok(Change::LookAgain);
                }
            }
        }
    }
}

/// Wakes every waiter of a key when any entry of its directory is deleted.
pub(crate) struct DirWatch(pub(crate) WatchStream);

impl DirWatch {
    pub(crate) async fn start(client: &Client, dir: Vec<u8>, bound: Duration) -> Result<Self> {
        let options = WatchOptions::new()
            .with_range(range_end(&dir))
            .with_filters([WatchFilterType::NoPut]);
        let what = "watching a key";
        let stream = with_timeout(
            "etcd",
            bound,
            what,
            client
                .watch_client()
                .watch(dir, Some(options))
                .map_err(|err| into_error(err, what)),
        )
        .await?;
        Ok(DirWatch(stream))
    }
}

#[async_trait]
impl KeyWatch for DirWatch {
    async fn changed(&mut self) -> Result<Change> {
        loop {
            match self.0.message().await {
                Ok(Some(reply)) if reply.canceled() || reply.compact_revision() > 0 => {
                    return Err(lock_core::Error::new(
                        lock_core::ErrorKind::Unavailable,
                        "etcd cancelled the watch",
                    ))
                }
                Ok(Some(reply)) if !reply.events().is_empty() => return Ok(Change::Released),
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(lock_core::Error::new(
                        lock_core::ErrorKind::Unavailable,
                        "etcd ended the watch",
                    ))
                }
                Err(err) => return Err(into_error(err, "watching a key")),
            }
        }
    }
}

/// Wakes a semaphore's or reader-writer lock's waiter when enough of the entries ahead of
/// it that stand in its way have left for its turn to have come (see
/// `shared::in_the_way`): every entry ahead but `limit - 1` for a permit, every writer
/// ahead for a read, every entry ahead for a write. A write waiter's readers ahead may
/// leave in any order, so one predecessor is not enough to watch: the watch covers the
/// directory (the writers' part for a read) and counts the deletions of those entries.
pub(crate) struct ShareWatch {
    client: Client,
    dir: Vec<u8>,
    own: Vec<u8>,
    kind: lock_core::HoldKind,
    request_timeout: Duration,
    current: Option<Blocked>,
}

/// A waiter's watch in place: the entries still in its way, and how many may stay.
struct Blocked {
    stream: WatchStream,
    in_the_way: std::collections::HashSet<Vec<u8>>,
    may_stay: usize,
}

impl ShareWatch {
    pub(crate) fn new(
        client: Client,
        dir: Vec<u8>,
        own: Vec<u8>,
        kind: lock_core::HoldKind,
        request_timeout: Duration,
    ) -> Self {
        ShareWatch {
            client,
            dir,
            own,
            kind,
            request_timeout,
            current: None,
        }
    }

    /// Watches the entries in the waiter's way. The watch is in place before the queue
    /// is read, so no deletion after the read goes unseen (and one before it is already
    /// out of the read). `None` when there is nothing to wait for: the turn has come, or
    /// the entry is gone.
    async fn watch_in_the_way(&self) -> Result<Option<Blocked>> {
        let watched = match self.kind {
            lock_core::HoldKind::Read => crate::keys::part(&self.dir, lock_core::HoldKind::Write),
            _ => self.dir.clone(),
        };
        let options = WatchOptions::new()
            .with_range(range_end(&watched))
            .with_filters([WatchFilterType::NoPut]);
        let what = "watching the queue";
        let mut stream = with_timeout(
            "etcd",
            self.request_timeout,
            what,
            self.client
                .watch_client()
                .watch(watched, Some(options))
                .map_err(|err| into_error(err, what)),
        )
        .await?;
        let confirmed =
            with_timeout("etcd", self.request_timeout, what, stream.message().map(Ok)).await?;
        if !matches!(confirmed, Ok(Some(reply)) if reply.created() && !reply.canceled()) {
            return Ok(None);
        }
        let options = GetOptions::new()
            .with_range(range_end(&self.dir))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        let found = with_timeout(
            "etcd",
            self.request_timeout,
            "looking at the queue",
            self.client
                .kv_client()
                .get(self.dir.clone(), Some(options))
                .map_err(|err| into_error(err, "looking at the queue")),
        )
        .await?;
        let Some((in_the_way, may_stay)) =
            crate::keys::in_the_way(&self.dir, found.kvs(), &self.own, self.kind)
        else {
            return Ok(None);
        };
        Ok((in_the_way.len() > may_stay).then_some(Blocked {
            stream,
            in_the_way,
            may_stay,
        }))
    }
}

#[async_trait]
impl KeyWatch for ShareWatch {
    async fn changed(&mut self) -> Result<Change> {
        loop {
            let Some(blocked) = self.current.as_mut() else {
                match self.watch_in_the_way().await? {
                    Some(blocked) => {
                        self.current = Some(blocked);
                        continue;
                    }
                    None => return Ok(Change::LookAgain),
                }
            };
            match blocked.stream.message().await {
                Ok(Some(reply)) if reply.canceled() || reply.compact_revision() > 0 => {
                    self.current = None;
                    return Ok(Change::LookAgain);
                }
                Ok(Some(reply)) => {
                    for event in reply.events() {
                        if let Some(kv) = event.kv() {
                            blocked.in_the_way.remove(kv.key());
                        }
                    }
                    if blocked.in_the_way.len() <= blocked.may_stay {
                        self.current = None;
                        return Ok(Change::Released);
                    }
                }
                Ok(None) | Err(_) => {
                    self.current = None;
                    return Ok(Change::LookAgain);
                }
            }
        }
    }
}
