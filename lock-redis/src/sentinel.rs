//! Finding the primary through Redis Sentinel, and hearing when Sentinel moves it.
//!
//! Our own, not redis-rs's `sentinel` feature: that client bounds no sentinel request by a
//! time-out (one silent sentinel stalls the lookup), needs `&mut` access (a lock around
//! every lookup), and brings `rand` and `log` into the dependency tree. What is needed is
//! small: ask the sentinels for the primary's address (here), check the primary's
//! `ROLE` on the connection that will be used (`node.rs`), and subscribe to
//! `+switch-master`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lock_core::backend::{
    supervise_listener, with_timeout, ListenerLink, ListenerTask, ReleaseFeed,
};
use lock_core::{Error, ErrorKind, Result};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::config::{NodeTarget, RedisConfig};
use crate::error::into_error;

/// The sentinels of one primary, and how to connect to the primary they name.
pub(crate) struct Sentinels {
    master: String,
    sentinels: Vec<(redis::Client, String)>,
    /// The configuration the primary is connected with (credentials, database).
    config: RedisConfig,
}

impl Sentinels {
    /// The sentinels of a `redis+sentinel://` configuration (`None` for any other).
    pub(crate) fn of(config: &RedisConfig) -> Result<Option<Self>> {
        let Some(master) = config.sentinel_master() else {
            return Ok(None);
        };
        let sentinels = config
            .sentinel_targets()?
            .into_iter()
            .map(|NodeTarget { shown, info }| {
                redis::Client::open(info)
                    .map(|client| (client, shown.clone()))
                    .map_err(|e| into_error(e, "configure", &shown))
            })
            .collect::<Result<_>>()?;
        Ok(Some(Sentinels {
            master: master.to_string(),
            sentinels,
            config: config.clone(),
        }))
    }

    /// The configuration as shown in messages: sentinels and master name, no credentials.
    pub(crate) fn shown(&self) -> String {
        let hosts: Vec<&str> = self
            .sentinels
            .iter()
            .map(|(_, shown)| shown.trim_start_matches("redis://").trim_end_matches("/0"))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master)
    }

    /// The primary as the sentinels name it now: every sentinel is asked
    /// `SENTINEL get-master-addr-by-name` at once, and the first to name a primary wins
    /// (the caller checks the primary's `ROLE`), so a silent sentinel costs nothing while
    /// another answers. A sentinel that does not know the name, or does not answer within
    /// `timeout`, is passed over. When none names a primary it is
    /// [`ErrorKind::Misconfigured`] if a sentinel answered that it monitors no such name
    /// (sentinels are each configured with their masters: a name one of them does not
    /// know is a mistake, not a passing state), else [`ErrorKind::Unavailable`].
    pub(crate) async fn primary(&self, timeout: Duration) -> Result<NodeTarget> {
        let mut asked: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|(client, shown)| async move {
                let store = format!("redis sentinel {shown}");
                let answer = with_timeout(&store, timeout, "get-master-addr-by-name", async {
                    let mut connection = connect(client, timeout)
                        .await
                        .map_err(|e| into_error(e, "connect", shown))?;
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(&self.master)
                        .query_async::<Option<(String, u16)>>(&mut connection)
                        .await
                        .map_err(|e| into_error(e, "get-master-addr-by-name", shown))
                })
                .await;
                (shown, answer)
            })
            .collect();
        let mut unknown = 0;
        let mut last_error = None;
        while let Some((shown, answer)) = asked.next().await {
            match answer {
                Ok(Some((host, port))) => {
                    tracing::debug!(sentinel = shown, master = self.master, %host, port, "primary located");
                    return self.config.target_at(&host, port);
                }
                Ok(None) => unknown += 1,
                Err(err) => {
                    tracing::debug!(sentinel = shown, error = %err, "sentinel did not answer");
                    last_error = Some(err);
                }
            }
        }
        if unknown > 0 {
            return Err(Error::misconfigured(format!(
                "{}: no sentinel monitors a master named {:?}",
                self.shown(),
                self.master
            )));
        }
        Err(last_error.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{}: no sentinel names a primary", self.shown()),
            )
        }))
    }

    /// Subscribes to `+switch-master` on one sentinel at a time (the next one after each
    /// failure, reconnecting with the core's backoff) and calls `switched` whenever
    /// Sentinel announces a new primary for this master, until the task is dropped.
    pub(crate) fn follow_switches(
        self: &Arc<Self>,
        timeout: Duration,
        switched: impl Fn() + Send + Sync + 'static,
    ) -> ListenerTask {
        let sentinels = Arc::clone(self);
        let switched = Arc::new(switched);
        let mut run = 0;
        // No waiter watches this feed: the supervisor is used for its reconnect loop only.
        supervise_listener(
            "redis sentinel subscription",
            ReleaseFeed::new(),
            move |link| {
                run += 1;
                let (sentinels, switched) = (Arc::clone(&sentinels), Arc::clone(&switched));
                let index = run % sentinels.sentinels.len();
                async move { sentinels.listen(index, timeout, link, &*switched).await }
            },
        )
    }

    async fn listen(
        &self,
        index: usize,
        timeout: Duration,
        link: ListenerLink,
        switched: &(dyn Fn() + Send + Sync),
    ) -> Result<()> {
        let (client, shown) = &self.sentinels[index];
        let store = format!("redis sentinel {shown}");
        let pubsub = with_timeout(&store, timeout, "subscribe", async {
            let attempt = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe("+switch-master").await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            attempt.await.map_err(|e| into_error(e, "subscribe", shown))
        })
        .await?;
        link.subscribed();
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            // `<master name> <old ip> <old port> <new ip> <new port>`
            let text = String::from_utf8_lossy(message.get_payload_bytes());
            if text.split(' ').next() == Some(self.master.as_str()) {
                tracing::info!(sentinel = shown, switch = %text, "sentinel switched the primary");
                switched();
            }
        }
        Ok(())
    }
}

/// A connection to a sentinel for one lookup.
async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}
