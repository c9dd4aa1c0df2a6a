//! A queued waiter's wake-up: a one-shot watch on its predecessor only, so a release
//! wakes the next waiter and nobody else (no herd).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use lock_core::backend::async_trait;
use lock_core::backend::{lock_unpoisoned as lock, Change, KeyWatch};
use lock_core::Result;
use zookeeper_client::{Client, Error as ZkError, EventType, WatchedEvent};

use crate::error::into_error;
use crate::keys::contenders;

type Pending = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// What a waiter last saw ahead of its node, shared by its attempts and its turn watch.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// The node the latest attempt saw just ahead of ours, and whether it was the first
    /// (the holder). While it exists it is still the one ahead (nodes created later queue
    /// behind ours), so it is watched without listing the queue again.
    node: Mutex<Option<(String, bool)>>,
    /// The node ahead was the first and has been deleted: nothing can be ahead of ours any
    /// more, so the attempt that follows needs no look at the queue.
    first_gone: AtomicBool,
}

impl Ahead {
    /// An attempt saw `node` just ahead of ours; `first` when it was the holder.
    pub(crate) fn saw(&self, node: String, first: bool) {
        *lock(&self.node) = Some((node, first));
    }

    /// Whether the holder just ahead of ours was deleted since the last call.
    pub(crate) fn take_turn(&self) -> bool {
        self.first_gone.swap(false, Ordering::SeqCst)
    }
}

/// Watches the node just ahead of `own` in the queue of `parent`.
pub(crate) struct TurnWatch {
    client: Client,
    parent: String,
    own: String,
    ahead: Arc<Ahead>,
    /// The armed watch is on the first node of the queue.
    armed_first: bool,
    /// The armed watch, kept across a cancelled wait so it is not registered again (a
    /// dropped watcher is removed from the client).
    pending: Option<Pending>,
}

impl TurnWatch {
    pub(crate) fn new(client: Client, parent: String, own: String, ahead: Arc<Ahead>) -> Self {
        TurnWatch {
            client,
            parent,
            own,
            ahead,
            armed_first: false,
            pending: None,
        }
    }

    /// Watches `name` (the first node of the queue when `first`) if it still exists.
    async fn arm(&mut self, name: &str, first: bool) -> Result<bool> {
        let path = format!("{}/{name}", self.parent);
        match self.client.check_and_watch_stat(&path).await {
            Ok((Some(_), watcher)) => {
                self.pending = Some(Box::pin(watcher.changed()));
                self.armed_first = first;
                Ok(true)
            }
            // Gone already (a watch on a missing node would fire on its creation, which
            // never comes).
            Ok((None, _)) => Ok(false),
            Err(err) => Err(into_error(err, "watching the node ahead")),
        }
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
            if let Some((ahead, first)) = hint {
                if self.arm(&ahead, first).await? {
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
            let Some(ahead) = at.checked_sub(1).map(|i| &queue[i]) else {
                // First in line: the key is ours to take.
                return Ok(Change::Released);
            };
            let ahead = ahead.name.clone();
            self.arm(&ahead, at == 1).await?;
        }
    }
}
