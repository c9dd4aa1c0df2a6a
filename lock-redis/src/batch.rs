//! Batched renewal: renewals requested while a batch is on its way are sent together as the
//! next batch, one script call for all of them (group commit). A lone renewal goes out at
//! once, so batching adds no waiting; under load the number of round trips stays flat
//! however many locks the client holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use lock_core::{Error, ErrorKind, Result};
use tokio::sync::oneshot;

use crate::error::unexpected_reply;
use crate::node::{Node, RENEW_MANY};

/// Largest number of renewals in one script call, so one call never blocks the server long.
const MAX_BATCH: usize = 512;

/// One requested renewal.
struct Renewal {
    lock_key: String,
    lease: String,
    ttl_ms: u64,
    reply: oneshot::Sender<Result<bool>>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Renewal>,
    flushing: bool,
}

/// The renewal queue of one node.
#[derive(Default)]
pub(crate) struct RenewBatcher {
    queue: Mutex<Queue>,
}

impl RenewBatcher {
    /// Queues a renewal and waits for its outcome; starts a flusher if none runs.
    pub(crate) async fn renew(
        self: &Arc<Self>,
        node: &Arc<Node>,
        lock_key: String,
        lease: String,
        ttl_ms: u64,
        bound: Duration,
    ) -> Result<bool> {
        let (reply, outcome) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.waiting.push(Renewal {
                lock_key,
                lease,
                ttl_ms,
                reply,
            });
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start {
            // A task of its own, so a caller that gives up does not strand the others.
            tokio::spawn(Arc::clone(self).flush(Arc::clone(node), bound));
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::Internal, "renewal batch abandoned")))
    }

    async fn flush(self: Arc<Self>, node: Arc<Node>, bound: Duration) {
        loop {
            let batch = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if queue.waiting.is_empty() {
                    queue.flushing = false;
                    return;
                }
                std::mem::take(&mut queue.waiting)
            };
            let mut chunks = Vec::new();
            let mut rest = batch;
            while rest.len() > MAX_BATCH {
                let tail = rest.split_off(MAX_BATCH);
                chunks.push(rest);
                rest = tail;
            }
            chunks.push(rest);
            join_all(chunks.into_iter().map(|chunk| send(&node, chunk, bound))).await;
        }
    }
}

async fn send(node: &Node, chunk: Vec<Renewal>, bound: Duration) {
    let mut invocation = RENEW_MANY.prepare_invoke();
    for renewal in &chunk {
        invocation
            .key(&renewal.lock_key)
            .arg(&renewal.lease)
            .arg(renewal.ttl_ms);
    }
    // A renewal answered after its TTL is worthless, and later batches wait for this one.
    let shortest = chunk
        .iter()
        .map(|r| Duration::from_millis(r.ttl_ms))
        .min()
        .unwrap_or(bound);
    let limit = bound.min(shortest);
    let result =
        match tokio::time::timeout(limit, node.invoke::<Vec<i64>>(&invocation, "renew")).await {
            Ok(Ok(renewed)) if renewed.len() == chunk.len() => Ok(renewed),
            Ok(Ok(_)) => Err(unexpected_reply("renew", node.shown())),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "redis {}: renewal not answered within {limit:?}",
                    node.shown()
                ),
            )),
        };
    match result {
        Ok(renewed) => {
            for (renewal, renewed) in chunk.into_iter().zip(renewed) {
                // The caller may have given up; nothing to tell then.
                let _ = renewal.reply.send(Ok(renewed == 1));
            }
        }
        Err(err) => {
            for renewal in chunk {
                let _ = renewal.reply.send(Err(err.clone()));
            }
        }
    }
}
