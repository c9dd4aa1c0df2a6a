//! Release notifications: one shared pub/sub subscription per node and client, fanned out
//! to the waiters of that client through a [`ReleaseFeed`]. The core's
//! [`supervise_listener`] keeps each subscription up (reconnecting with backoff, waking
//! every waiter when releases may have gone unheard); what is Redis's own is here: how to
//! subscribe, and counting a Redlock release's announcements ([`Tally`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_core::backend::{
    lock_unpoisoned, supervise_listener, with_timeout, KeyWatch, ListenerLink, ListenerTask,
    ReleaseFeed,
};
use lock_core::Result;
use tokio::sync::watch;

use crate::error::into_error;
use crate::keys::Layout;
use crate::node::{Node, Source};

/// Most releases remembered for coalescing; beyond it the oldest are forgotten (which
/// costs at most a spurious wake-up).
const REMEMBERED: usize = 4096;

/// The release subscriptions of one backend client, one per node, kept up in background
/// tasks from connect on (and stopped when it is dropped).
///
/// They start with the client rather than with its first waiter, so that a waiter's
/// [`watch`](Notifier::watch) never waits for a subscription (which may take a connect
/// time-out on an unreachable node) and is live before the waiter's first attempt.
pub(crate) struct Notifier {
    releases: ReleaseFeed,
    /// How many subscriptions have had their first attempt, successful or not.
    settled: watch::Receiver<usize>,
    listeners: Vec<ListenerTask>,
}

/// What every subscription of one client shares.
struct Subscription {
    channel: String,
    connect_timeout: Duration,
    seen: Mutex<Tally>,
    settle: watch::Sender<usize>,
    /// The missing permission to subscribe has been reported (once per client is enough).
    warned: AtomicBool,
}

impl Notifier {
    /// Starts subscribing to `channel` on every node. A release wakes a waiter once
    /// `quorum` nodes have announced it, counting messages that arrive within `window` of
    /// the release's first.
    pub(crate) fn start(
        nodes: &[&Node],
        channel: String,
        connect_timeout: Duration,
        quorum: usize,
        window: Duration,
    ) -> Self {
        let releases = ReleaseFeed::new();
        let (settle, settled) = watch::channel(0);
        let shared = Arc::new(Subscription {
            channel,
            connect_timeout,
            seen: Mutex::new(Tally::new(quorum, window)),
            settle,
            warned: AtomicBool::new(false),
        });
        let listeners = nodes
            .iter()
            .map(|node| {
                let source = node.source().clone();
                let shared = Arc::clone(&shared);
                let mut first = true;
                supervise_listener(
                    "redis release subscription",
                    releases.clone(),
                    move |link| {
                        let first = std::mem::take(&mut first);
                        listen(source.clone(), Arc::clone(&shared), first, link)
                    },
                )
            })
            .collect();
        Notifier {
            releases,
            settled,
            listeners,
        }
    }

    /// Returns once every subscription has made its first attempt (each bounded by the
    /// connect time-out), so that waiters of a freshly connected client hear releases.
    pub(crate) async fn settled(&self) {
        let total = self.listeners.len();
        // A closed channel means the listeners are gone; nothing to wait for then.
        let _ = self.settled.clone().wait_for(|n| *n >= total).await;
    }

    /// A watch on `redis_key`, woken by the releases heard from now on.
    pub(crate) fn watch(&self, redis_key: String) -> Box<dyn KeyWatch> {
        self.releases.watch(redis_key)
    }
}

/// One run of a node's subscription: find the server (behind Sentinel, the primary named
/// now, whose releases its replicas hear too), subscribe (bounded by the connect
/// time-out), then deliver releases until the connection ends.
async fn listen(
    source: Source,
    shared: Arc<Subscription>,
    first: bool,
    link: ListenerLink,
) -> Result<()> {
    let subscribed = match source.locate(shared.connect_timeout).await {
        Ok((client, shown)) => subscribe(&client, &shown, &shared).await,
        Err(err) => Err(err),
    };
    let messages = subscribed.map(|pubsub| {
        link.subscribed();
        pubsub.into_on_message()
    });
    if first {
        shared.settle.send_modify(|n| *n += 1);
    }
    let mut messages = messages?;
    while let Some(message) = messages.next().await {
        let text = String::from_utf8_lossy(message.get_payload_bytes());
        if lock_unpoisoned(&shared.seen).is_news(&text) {
            let name = released_key(&text);
            if Layout::releases_many(name) {
                link.feed().released_to_many(name);
            } else {
                link.feed().released(name);
            }
        }
    }
    Ok(())
}

/// Subscribes to the release channel on `client` (the server `shown`), bounded by the
/// connect time-out.
async fn subscribe(
    client: &redis::Client,
    shown: &str,
    shared: &Subscription,
) -> Result<redis::aio::PubSub> {
    let store = format!("redis {shown}");
    with_timeout(&store, shared.connect_timeout, "subscribe", async {
        let attempt = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&shared.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        attempt.await.map_err(|err| {
            if err.code() == Some("NOPERM") && !shared.warned.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    channel = shared.channel,
                    "the Redis user may not subscribe to the release channel, so waiters poll; \
                     grant it with ACL SETUSER <user> &<channel>"
                );
            }
            into_error(err, "subscribe", shown)
        })
    })
    .await
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
