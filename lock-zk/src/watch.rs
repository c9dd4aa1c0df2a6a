//! A queued waiter's wake-up: one-shot watches on the nodes that decide its turn only (a
//! mutex's or a writer's predecessor, a reader's nearest writer ahead, the nodes ahead
//! that a permit counts), so a release wakes the waiters it may concern and nobody else
//! (no herd).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::select_all;
use futures_util::FutureExt;
use lock_core::backend::async_trait;
use lock_core::backend::{lock_unpoisoned as lock, Change, KeyWatch};
use lock_core::{HoldKind, LockKey, Result};
use zookeeper_client::{Client, Error as ZkError, EventType, WatchedEvent};

use crate::error::into_error;
use crate::keys::contenders;
use crate::shared::{rank, Rank};

/// The most nodes a waiter watches one by one; a permit of a larger semaphore watches its
/// queue's children instead (any change wakes it, and it looks again).
const MOST_WATCHED: usize = 16;

type Pending = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// What a waiter last saw ahead of its node, shared by its attempts and its turn watch.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// The nodes the latest attempt saw deciding our turn ([`Rank::Behind`]), and whether
    /// they were decisive. While they exist they still decide it (nodes created later
    /// queue behind ours), so they are watched without listing the queue again.
    node: Mutex<Option<(Vec<String>, bool)>>,
    /// A decisive node has been deleted: our turn has come, and nothing can come ahead of
    /// ours any more, so the attempt that follows needs no look at the queue.
    first_gone: AtomicBool,
}

impl Ahead {
    /// An attempt saw `nodes` deciding our turn; `decisive` when the deletion of any one
    /// of them brings it.
    pub(crate) fn saw(&self, nodes: Vec<String>, decisive: bool) {
        *lock(&self.node) = Some((nodes, decisive));
    }

    /// Whether the holder just ahead of ours was deleted since the last call.
    pub(crate) fn take_turn(&self) -> bool {
        self.first_gone.swap(false, Ordering::SeqCst)
    }
}

/// Watches the nodes that decide the turn of `own` in the queue of `parent`.
pub(crate) struct TurnWatch {
    client: Client,
    parent: String,
    own: String,
    /// The key and how `own` holds it, which say what decides its turn.
    key: LockKey,
    ahead: Arc<Ahead>,
    /// The armed watches are on decisive nodes.
    armed_first: bool,
    /// The armed watch, kept across a cancelled wait so it is not registered again (a
    /// dropped watcher is removed from the client).
    pending: Option<Pending>,
}

impl TurnWatch {
    pub(crate) fn new(
        client: Client,
        parent: String,
        own: String,
        key: LockKey,
        ahead: Arc<Ahead>,
    ) -> Self {
        TurnWatch {
            client,
            parent,
            own,
            key,
            ahead,
            armed_first: false,
            pending: None,
        }
    }

    /// Watches `names` (decisive ones when `decisive`) if they all still exist; one that
    /// is gone already may have brought our turn, so nothing is armed and the queue is
    /// looked at again. Many names are watched through the queue's children.
    async fn arm(&mut self, names: &[String], decisive: bool) -> Result<bool> {
        if names.len() > MOST_WATCHED {
            return match self.client.list_and_watch_children(&self.parent).await {
                Ok((_, watcher)) => {
                    self.pending = Some(Box::pin(watcher.changed()));
                    self.armed_first = false;
                    Ok(true)
                }
                Err(ZkError::NoNode) => Ok(false),
                Err(err) => Err(into_error(err, "watching the queue")),
            };
        }
        // Sent together: the client writes each request as it is made.
        let looks: Vec<_> = names
            .iter()
            .map(|name| {
                self.client
                    .check_and_watch_stat(&format!("{}/{name}", self.parent))
            })
            .collect();
        let mut watchers = Vec::with_capacity(looks.len());
        let mut all_there = true;
        for look in looks {
            match look.await {
                Ok((Some(_), watcher)) => watchers.push(watcher.changed().boxed()),
                // Gone already (a watch on a missing node would fire on its creation, which
                // never comes).
                Ok((None, _)) => all_there = false,
                Err(err) => return Err(into_error(err, "watching the node ahead")),
            }
        }
        if !all_there || watchers.is_empty() {
            return Ok(false);
        }
        self.pending = Some(Box::pin(select_all(watchers).map(|(event, _, _)| event)));
        self.armed_first = decisive;
        Ok(true)
    }
}

#[async_trait]
impl KeyWatch for TurnWatch {
    async fn changed(&mut self) -> Result<Change> {
        loop {
            if let Some(pending) = self.pending.as_mut() {
                let event = pending.await;
                self.pending = None;
                if self.armed_first && event.event_type == EventType::NodeDeleted {
                    self.ahead.first_gone.store(true, Ordering::SeqCst);
                }
                return Ok(Change::Released);
            }
            let hint = lock(&self.ahead.node).take();
            if let Some((deciders, decisive)) = hint {
                if self.arm(&deciders, decisive).await? {
                    continue;
                }
            }
            let children = match self.client.list_children(&self.parent).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => return Ok(Change::LookAgain),
                Err(err) => return Err(into_error(err, "watching the queue")),
            };
            let queue = contenders(children);
            let Some(at) = queue.iter().position(|c| c.name == self.own) else {
                // Our node is gone: the attempt that follows finds out and queues again.
                return Ok(Change::LookAgain);
            };
            let kind: HoldKind = self.key.kind();
            match rank(&self.key, kind, &queue, at) {
                // Our turn: the key is ours to take.
                Ok(Rank::Turn) => return Ok(Change::Released),
                Ok(Rank::Behind { deciders, decisive }) => {
                    self.arm(&deciders, decisive).await?;
                }
                // Refused (a limit that disagrees): the attempt that follows says so.
                Err(_) => return Ok(Change::LookAgain),
            }
        }
    }
}
