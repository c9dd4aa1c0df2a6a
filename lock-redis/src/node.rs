//! One Redis server: a lazily (re)connected multiplexed connection and the lock scripts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use lock_core::{redact_url, Error, ErrorKind, Result};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, Script, ScriptInvocation};

use crate::error::{breaks_connection, from_redis};

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
pub(crate) static RENEW_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew_many.lua")));
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));
pub(crate) static RESERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/reserve.lua")));
pub(crate) static CONFIRM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/confirm.lua")));

/// A connection to one server, replaced whenever it may have lost track of its replies.
///
/// The multiplexed connection pairs replies with requests in order. A request that timed
/// out or was abandoned (its future dropped) may never be answered, for instance behind a
/// partition that swallowed it, and then every later reply would be paired with the wrong
/// request; so such a connection is dropped and the next request connects afresh.
pub(crate) struct Node {
    client: redis::Client,
    shown: String,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    connecting: tokio::sync::Mutex<()>,
    generations: AtomicU64,
}

impl Node {
    pub(crate) fn new(
        url: &str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self> {
        let shown = redact_url(url);
        let client = redis::Client::open(url).map_err(|e| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{shown}: not a valid Redis URL"),
            )
            .with_source(e)
        })?;
        Ok(Node {
            client,
            shown,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout)),
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
        })
    }

    /// The node's address with any password hidden.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The current connection, connecting first if there is none.
    pub(crate) async fn connection(&self) -> Result<(u64, MultiplexedConnection)> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let connect = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config);
        let connection = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(err)) => return Err(from_redis(err, "connect", &self.shown)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "redis {}: no connection within {:?}",
                        self.shown, self.connect_timeout
                    ),
                ))
            }
        };
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((generation, connection.clone()));
        Ok((generation, connection))
    }

    fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// Runs a script (by hash; reloaded transparently after NOSCRIPT).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<T> {
        let (generation, mut connection) = self.connection().await?;
        let mut guard = DiscardUnlessAnswered {
            node: self,
            generation,
            answered: false,
        };
        let result = invocation.invoke_async(&mut connection).await;
        guard.settle(result, what)
    }

    /// Runs one command.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd, what: &str) -> Result<T> {
        let (generation, mut connection) = self.connection().await?;
        let mut guard = DiscardUnlessAnswered {
            node: self,
            generation,
            answered: false,
        };
        let result = cmd.query_async(&mut connection).await;
        guard.settle(result, what)
    }

    /// Lock entries under `pattern` (a `SCAN MATCH` pattern), for inspection and tests.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, keys): (u64, Vec<String>) = self.query(&cmd, "scan").await?;
            found.extend(keys);
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }
}

/// Drops the connection if a request ends without a trustworthy reply, including when its
/// future is dropped mid-flight (a caller's time-out or cancellation).
struct DiscardUnlessAnswered<'a> {
    node: &'a Node,
    generation: u64,
    answered: bool,
}

impl DiscardUnlessAnswered<'_> {
    fn settle<T>(&mut self, result: redis::RedisResult<T>, what: &str) -> Result<T> {
        match result {
            Ok(value) => {
                self.answered = true;
                Ok(value)
            }
            Err(err) => {
                self.answered = !breaks_connection(&err);
                Err(from_redis(err, what, &self.node.shown))
            }
        }
    }
}

impl Drop for DiscardUnlessAnswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.node.discard(self.generation);
        }
    }
}
