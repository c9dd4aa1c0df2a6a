//! Release notifications: one shared pub/sub subscription per node and client, fanned out
//! to every waiter of that client.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::{KeyWatch, ReleaseFeed, Result};
use tokio::sync::{watch, OnceCell};
use tokio::task::JoinHandle;

/// Pause before resubscribing after a failure, doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Subscribes lazily, on the first [`watch`](Notifier::watch), to the release channel of
/// every node.
pub(crate) struct Notifier {
    clients: Vec<redis::Client>,
    channel: String,
    connect_timeout: Duration,
    running: OnceCell<Running>,
}

/// How far the subscriptions got: how many finished their first attempt, how many are live.
#[derive(Clone, Copy, Default)]
struct Progress {
    settled: usize,
    live: usize,
}

struct Running {
    releases: ReleaseFeed,
    progress: watch::Receiver<Progress>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Notifier {
    pub(crate) fn new(
        clients: Vec<redis::Client>,
        channel: String,
        connect_timeout: Duration,
    ) -> Self {
        Notifier {
            clients,
            channel,
            connect_timeout,
            running: OnceCell::new(),
        }
    }

    fn start(&self) -> Running {
        let releases = ReleaseFeed::new();
        let (progress_tx, progress) = watch::channel(Progress::default());
        let progress_tx = Arc::new(progress_tx);
        let tasks = self
            .clients
            .iter()
            .map(|client| {
                tokio::spawn(subscribe_forever(
                    client.clone(),
                    self.channel.clone(),
                    self.connect_timeout,
                    releases.clone(),
                    Arc::clone(&progress_tx),
                ))
            })
            .collect();
        Running {
            releases,
            progress,
            tasks,
        }
    }

    /// A watch on `redis_key`. Returns once every subscription has had its first chance to
    /// start (bounded by the connect time-out), so a release published after this returns
    /// is seen; a subscription that is down costs the waiter its fallback poll, no more.
    pub(crate) async fn watch(&self, redis_key: String) -> Result<Box<dyn KeyWatch>> {
        let running = self.running.get_or_init(|| async { self.start() }).await;
        // Subscribed before waiting, so nothing published from here on is missed.
        let watch = running.releases.watch(redis_key);
        let total = self.clients.len();
        let mut progress = running.progress.clone();
        let settled = progress.wait_for(|p| p.settled >= total);
        // Time-out and a closed channel both just mean "notifications may be late".
        let _ = tokio::time::timeout(self.connect_timeout, settled).await;
        tracing::trace!(live = progress.borrow().live, "release subscription");
        Ok(watch)
    }
}

async fn subscribe_forever(
    client: redis::Client,
    channel: String,
    connect_timeout: Duration,
    releases: ReleaseFeed,
    progress: Arc<watch::Sender<Progress>>,
) {
    let mut first = true;
    let mut pause = FIRST_PAUSE;
    loop {
        let subscribed = tokio::time::timeout(connect_timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        match subscribed {
            Ok(Ok(pubsub)) => {
                progress.send_modify(|p| {
                    p.live += 1;
                    p.settled += usize::from(first);
                });
                first = false;
                pause = FIRST_PAUSE;
                // Releases published while no subscription was live went unheard.
                releases.wake_all();
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    releases.released(&String::from_utf8_lossy(message.get_payload_bytes()));
                }
                progress.send_modify(|p| p.live = p.live.saturating_sub(1));
                releases.wake_all();
                tracing::debug!("release subscription ended; resubscribing");
            }
            failed => {
                if first {
                    progress.send_modify(|p| p.settled += 1);
                    first = false;
                }
                match failed {
                    Ok(Err(err)) => tracing::debug!(error = %err, "release subscription failed"),
                    _ => tracing::debug!("release subscription timed out"),
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
