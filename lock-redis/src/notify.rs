//! Release notifications: one shared pub/sub subscription per node and client, fanned out
//! to the waiters of that client through a [`ReleaseFeed`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_core::backend::{KeyWatch, ReleaseFeed};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Pause before resubscribing after a failure, doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// Most releases remembered for coalescing; beyond it the oldest are forgotten (which
/// costs at most a spurious wake-up).
const REMEMBERED: usize = 4096;

/// The release subscriptions of one backend client, one per node, kept up in background
/// tasks from connect on.
///
/// They start with the client rather than with its first waiter, so that a waiter's
/// [`watch`](Notifier::watch) never waits for a subscription (which may take a connect
/// time-out on an unreachable node) and is live before the waiter's first attempt.
pub(crate) struct Notifier {
    releases: ReleaseFeed,
    /// How many subscriptions have had their first attempt, successful or not.
    settled: watch::Receiver<usize>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Notifier {
    /// Starts subscribing to `channel` on every client. A release wakes a waiter once
    /// `quorum` nodes have announced it, counting messages that arrive within `window` of
    /// the release's first.
    pub(crate) fn start(
        clients: Vec<redis::Client>,
        channel: String,
        connect_timeout: Duration,
        quorum: usize,
        window: Duration,
    ) -> Self {
        let releases = ReleaseFeed::new();
        let seen = Arc::new(Mutex::new(Tally::new(quorum, window)));
        let (settle, settled) = watch::channel(0);
        let settle = Arc::new(settle);
        let tasks = clients
            .into_iter()
            .map(|client| {
                tokio::spawn(subscribe_forever(
                    client,
                    channel.clone(),
                    connect_timeout,
                    releases.clone(),
                    Arc::clone(&seen),
                    Arc::clone(&settle),
                ))
            })
            .collect();
        Notifier {
            releases,
            settled,
            tasks,
        }
    }

    /// Returns once every subscription has made its first attempt (each bounded by the
    /// connect time-out), so that waiters of a freshly connected client hear releases.
    pub(crate) async fn settled(&self) {
        let total = self.tasks.len();
        // A closed channel means the tasks are gone; nothing to wait for then.
        let _ = self.settled.clone().wait_for(|n| *n >= total).await;
    }

    /// A watch on `redis_key`, woken by the releases heard from now on.
    pub(crate) fn watch(&self, redis_key: String) -> Box<dyn KeyWatch> {
        self.releases.watch(redis_key)
    }
}

/// Counts the messages of recent releases, so that a release wakes one waiter once the
/// key is free on enough nodes to be taken: under Redlock every node that held the lease
/// publishes the release, and a waiter woken by the first message would race the rest of
/// the release, fail, and (the core backing off after a wake-up in vain) come back late.
struct Tally {
    /// How many messages about one release make it news: 1 on a single node, a majority
    /// under Redlock.
    needed: usize,
    /// How long after a release's first message its other messages may still arrive.
    window: Duration,
    recent: VecDeque<(Instant, String)>,
    heard: HashMap<String, usize>,
}

impl Tally {
    fn new(needed: usize, window: Duration) -> Self {
        Tally {
            needed,
            window,
            recent: VecDeque::new(),
            heard: HashMap::new(),
        }
    }

    /// Counts `message` (a lock key and the released lease); true exactly when it is the
    /// message that makes the release news.
    fn is_news(&mut self, message: &str) -> bool {
        if self.needed <= 1 {
            return true;
        }
        let now = Instant::now();
        while let Some((at, _)) = self.recent.front() {
            if now.duration_since(*at) < self.window && self.recent.len() < REMEMBERED {
                break;
            }
            if let Some((_, old)) = self.recent.pop_front() {
                self.heard.remove(&old);
            }
        }
        let count = self.heard.entry(message.to_string()).or_insert(0);
        *count += 1;
        if *count == 1 {
            self.recent.push_back((now, message.to_string()));
        }
        *count == self.needed
    }
}

/// The lock key a release message names: messages are `<lock key>\n<lease id>` (the
/// prefix cannot contain a control character, so the split is unambiguous).
fn released_key(message: &str) -> &str {
    message.split_once('\n').map_or(message, |(key, _)| key)
}

async fn subscribe_forever(
    client: redis::Client,
    channel: String,
    connect_timeout: Duration,
    releases: ReleaseFeed,
    seen: Arc<Mutex<Tally>>,
    settle: Arc<watch::Sender<usize>>,
) {
    let mut pause = FIRST_PAUSE;
    let mut first = true;
    let mut warned = false;
    loop {
        let subscribed = tokio::time::timeout(connect_timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        if std::mem::take(&mut first) {
            settle.send_modify(|n| *n += 1);
        }
        match subscribed {
            Ok(Ok(pubsub)) => {
                pause = FIRST_PAUSE;
                // Releases published while this subscription was down went unheard. (One
                // wake-up, here, not also when it went down: a wake-up that finds the key
                // still held makes the core back off before the next one.)
                releases.wake_all();
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let text = String::from_utf8_lossy(message.get_payload_bytes());
                    let news = seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_news(&text);
                    if news {
                        releases.released(released_key(&text));
                    }
                }
                tracing::debug!("release subscription ended; resubscribing");
            }
            Ok(Err(err)) if err.code() == Some("NOPERM") && !warned => {
                warned = true;
                tracing::warn!(
                    channel,
                    "the Redis user may not subscribe to the release channel, so waiters poll; \
                     grant it with ACL SETUSER <user> &<channel>"
                );
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "release subscription failed"),
            Err(_) => tracing::debug!("release subscription timed out"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_news_once_a_majority_announced_it() {
        let mut heard = Tally::new(3, Duration::from_secs(60));
        assert!(!heard.is_news("p{6b}\naa"));
        assert!(
            !heard.is_news("p{6b}\nbb"),
            "another lease's release of the key"
        );
        assert!(!heard.is_news("p{6b}\naa"));
        assert!(heard.is_news("p{6b}\naa"), "the third node");
        assert!(!heard.is_news("p{6b}\naa"), "the fourth node");
        assert!(!heard.is_news("p{6b}\naa"), "the fifth node");
        let mut single = Tally::new(1, Duration::ZERO);
        assert!(single.is_news("k\naa"));
        assert!(single.is_news("k\naa"));
        assert_eq!(released_key("p x{6b}\naa"), "p x{6b}");
        assert_eq!(released_key("p{6b}"), "p{6b}");
    }

    #[test]
    fn memory_stays_bounded() {
        let mut heard = Tally::new(2, Duration::from_secs(60));
        for i in 0..REMEMBERED * 3 {
            assert!(!heard.is_news(&format!("k\n{i:x}")));
        }
        assert!(heard.recent.len() <= REMEMBERED);
        assert_eq!(heard.recent.len(), heard.heard.len());
    }
}
