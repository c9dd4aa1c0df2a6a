//! One Redis server (or the primary Sentinel names): a multiplexed connection (re)made in
//! the background, on which the backends run their scripts.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::backend::{lock_unpoisoned as lock, with_timeout, ListenerTask};
use lock_core::{Error, ErrorKind, Result};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, ScriptInvocation};
use tokio::sync::watch;

use crate::config::{NodeTarget, RedisConfig};
use crate::error::{breaks_connection, into_error, needs_new_connection};
use crate::sentinel::Sentinels;

/// How a node connects, shared by every node of a backend.
#[derive(Clone, Copy)]
pub(crate) struct NodeOptions {
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Whether a server that may evict keys is accepted (see [`check_eviction`]).
    allow_eviction: bool,
}

impl NodeOptions {
    /// How every node of `config` connects.
    pub(crate) fn new(config: &RedisConfig) -> Self {
        NodeOptions {
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            allow_eviction: config.allow_eviction,
        }
    }
}

/// A connection to one server, replaced whenever it may have lost track of its replies.
///
/// The multiplexed connection pairs replies with requests in order. A request that timed
/// out or was abandoned (its future dropped) may never be answered, for instance behind a
/// partition that swallowed it, and then every later reply would be paired with the wrong
/// request; so such a connection is dropped and the next request connects afresh.
///
/// Connecting runs in a task of its own, bounded only by the connect time-out: a caller
/// with a shorter bound (a Redlock node time-out) gives up waiting, but the connection is
/// still made and kept for the next request. Otherwise a node whose connect-and-setup takes
/// longer than that bound (a WAN, TLS) could never reconnect once its connection dropped.
///
/// Behind Sentinel, every connection is made to the primary the sentinels name at that
/// moment, and only once it answers `ROLE` as a master. So following a failover is
/// dropping the connection: on a broken connection or a `READONLY` reply (the server was
/// demoted), and when a sentinel announces `+switch-master`.
pub(crate) struct Node {
    source: Source,
    shown: String,
    options: NodeOptions,
    state: Arc<Mutex<State>>,
    /// Behind Sentinel: the `+switch-master` subscription, stopped with the node.
    _switches: Option<ListenerTask>,
}

/// Where a node's connections go.
#[derive(Clone)]
pub(crate) enum Source {
    /// One server, always the same (the client boxed: it is large, and clones are rare).
    Fixed {
        client: Box<redis::Client>,
        shown: String,
    },
    /// Whichever server the sentinels name as primary when connecting.
    Sentinel(Arc<Sentinels>),
}

impl Source {
    /// The server, or the sentinels, as shown in messages.
    fn shown(&self) -> String {
        match self {
            Source::Fixed { shown, .. } => shown.clone(),
            Source::Sentinel(sentinels) => sentinels.shown(),
        }
    }

    /// The server to connect to now, and its address for messages.
    pub(crate) async fn locate(&self, timeout: Duration) -> Result<(redis::Client, String)> {
        match self {
            Source::Fixed { client, shown } => Ok((client.as_ref().clone(), shown.clone())),
            Source::Sentinel(sentinels) => {
                let NodeTarget { shown, info } = sentinels.primary(timeout).await?;
                let client =
                    redis::Client::open(info).map_err(|e| into_error(e, "configure", &shown))?;
                Ok((client, shown))
            }
        }
    }
}

#[derive(Default)]
struct State {
    connection: Link,
    /// Numbers connections, so a request discards only the one it used.
    generations: u64,
}

type Connected = (u64, MultiplexedConnection);
type Outcome = Option<Result<Connected>>;

#[derive(Default)]
enum Link {
    #[default]
    Down,
    /// A connect task runs; it publishes its outcome here.
    Connecting(watch::Receiver<Outcome>),
    Up(Connected),
}

impl Node {
    pub(crate) fn new(target: NodeTarget, options: NodeOptions) -> Result<Self> {
        let NodeTarget { shown, info } = target;
        let client = redis::Client::open(info).map_err(|e| into_error(e, "configure", &shown))?;
        Ok(Node {
            source: Source::Fixed {
                client: Box::new(client),
                shown: shown.clone(),
            },
            shown,
            options,
            state: Arc::default(),
            _switches: None,
        })
    }

    /// The primary `sentinels` name, followed across failovers. Must be called within a
    /// Tokio runtime (it starts the `+switch-master` subscription).
    pub(crate) fn behind(sentinels: Sentinels, options: NodeOptions) -> Self {
        let sentinels = Arc::new(sentinels);
        let state: Arc<Mutex<State>> = Arc::default();
        let weak = Arc::downgrade(&state);
        let switches = sentinels.follow_switches(options.connect_timeout, move || forget(&weak));
        Node {
            shown: sentinels.shown(),
            source: Source::Sentinel(sentinels),
            options,
            state,
            _switches: Some(switches),
        }
    }

    /// The node's address (it never carries credentials).
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// Where the node's connections go, for connections of other kinds (subscriptions).
    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    /// The current connection, waiting for one to be made if there is none.
    pub(crate) async fn connection(&self) -> Result<Connected> {
        // A connect that was already under way may have been started into a partition
        // that has healed since; when it fails, this caller tries once on its own.
        let mut retried = false;
        loop {
            let (mut outcome, joined) = {
                let mut state = lock(&self.state);
                match &state.connection {
                    Link::Up(connected) => return Ok(connected.clone()),
                    // A task that died without an outcome (its runtime shut down) is replaced.
                    Link::Connecting(outcome) if outcome.has_changed().is_ok() => {
                        (outcome.clone(), true)
                    }
                    _ => {
                        let (publish, outcome) = watch::channel(None);
                        state.connection = Link::Connecting(outcome.clone());
                        tokio::spawn(connect(
                            self.source.clone(),
                            self.options,
                            Arc::clone(&self.state),
                            publish,
                        ));
                        (outcome, false)
                    }
                }
            };
            let result = match outcome.wait_for(Option::is_some).await {
                Ok(done) => done.clone(),
                Err(_) => None,
            };
            match result {
                Some(Err(_)) if joined && !retried => retried = true,
                Some(result) => return result,
                None => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("redis {}: connecting was interrupted", self.shown),
                    ))
                }
            }
        }
    }

    fn discard(&self, generation: u64) {
        let mut state = lock(&self.state);
        if matches!(&state.connection, Link::Up((g, _)) if *g == generation) {
            state.connection = Link::Down;
        }
    }

    /// The current connection, held for several requests: see [`Pinned`].
    pub(crate) async fn pin(&self) -> Result<Pinned<'_>> {
        let (generation, connection) = self.connection().await?;
        Ok(Pinned {
            node: self,
            generation,
            connection,
        })
    }

    /// Runs a script (by hash; reloaded transparently after NOSCRIPT).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<T> {
        self.pin().await?.invoke(invocation, what).await
    }

    /// Runs one command.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd, what: &str) -> Result<T> {
        self.pin().await?.query(cmd, what).await
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

/// One connection of a node, kept for requests that belong together: a `WAIT` sent through
/// it waits for the writes sent through it before (Redis counts a client's own writes), which
/// a `WAIT` on a fresh connection after a reconnect would not.
pub(crate) struct Pinned<'a> {
    node: &'a Node,
    generation: u64,
    connection: MultiplexedConnection,
}

impl Pinned<'_> {
    /// The node this connection goes to.
    pub(crate) fn node(&self) -> &Node {
        self.node
    }

    /// Runs a script (by hash; reloaded transparently after NOSCRIPT) on this connection.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<T> {
        let mut connection = self.connection.clone();
        let mut guard = self.discard_unless_answered();
        let result = invocation.invoke_async(&mut connection).await;
        guard.settle(result, what)
    }

    /// Runs one command on this connection.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd, what: &str) -> Result<T> {
        let mut connection = self.connection.clone();
        let mut guard = self.discard_unless_answered();
        let result = cmd.query_async(&mut connection).await;
        guard.settle(result, what)
    }

    fn discard_unless_answered(&self) -> DiscardUnlessAnswered<'_> {
        DiscardUnlessAnswered {
            node: self.node,
            generation: self.generation,
            answered: false,
        }
    }
}

/// Finds the server (behind Sentinel: asks the sentinels), connects and checks it, all
/// bounded by the connect time-out, then installs the connection (or clears the way for
/// the next attempt) and tells whoever waits.
async fn connect(
    source: Source,
    options: NodeOptions,
    state: Arc<Mutex<State>>,
    publish: watch::Sender<Outcome>,
) {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout));
    let attempt = async {
        let (client, shown) = source.locate(options.connect_timeout).await?;
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|err| into_error(err, "connect", &shown))?;
        if let Source::Sentinel(_) = source {
            check_primary(&mut connection, &shown).await?;
        }
        check_eviction(&mut connection, &shown, options.allow_eviction).await?;
        Ok(connection)
    };
    let store = format!("redis {}", source.shown());
    let result = with_timeout(&store, options.connect_timeout, "connect", attempt).await;
    let outcome = {
        let mut state = lock(&state);
        match result {
            Ok(connection) => {
                state.generations += 1;
                let connected = (state.generations, connection);
                state.connection = Link::Up(connected.clone());
                Ok(connected)
            }
            Err(err) => {
                state.connection = Link::Down;
                Err(err)
            }
        }
    };
    publish.send_replace(Some(outcome));
}

/// Forgets the node's connection, whichever it is, so the next request connects afresh
/// (behind Sentinel: to the primary the sentinels name then).
fn forget(state: &Weak<Mutex<State>>) {
    if let Some(state) = state.upgrade() {
        let mut state = lock(&state);
        if matches!(state.connection, Link::Up(_)) {
            state.connection = Link::Down;
        }
    }
}

/// Refuses a server a sentinel named as primary that does not answer `ROLE` as one: a
/// failover is under way (the sentinels' view lags the servers'), or the sentinel's view
/// is stale. [`ErrorKind::Unavailable`], so the caller retries and the next connection
/// asks the sentinels again.
async fn check_primary(connection: &mut MultiplexedConnection, shown: &str) -> Result<()> {
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(connection)
        .await
        .map_err(|err| into_error(err, "role", shown))?;
    let role = role
        .first()
        .and_then(|role| String::from_redis_value_ref(role).ok());
    match role.as_deref() {
        Some("master") => Ok(()),
        other => Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "redis {shown}: Sentinel names it the primary, but it answers ROLE as {}",
                other.unwrap_or("nothing known")
            ),
        )),
    }
}

/// Refuses a server that may evict keys, unless the operator accepted that: under a
/// `volatile-*` policy Redis evicts lock entries (they have a TTL), so a live lock vanishes
/// and a rival acquires it; under `allkeys-*` it also evicts fencing counters (which then
/// start again from the server's clock). A server that does not let us read the policy (`CONFIG` renamed or
/// denied by an ACL) is assumed to be `noeviction`, with a warning, as documented.
async fn check_eviction(
    connection: &mut MultiplexedConnection,
    shown: &str,
    allow_eviction: bool,
) -> Result<()> {
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(connection)
        .await;
    let policy = match reply {
        Ok(pair) => pair.into_iter().nth(1),
        Err(err) if breaks_connection(&err) => return Err(into_error(err, "connect", shown)),
        Err(err) => {
            tracing::warn!(
                node = shown,
                error = %err,
                "cannot read maxmemory-policy; assuming noeviction (locks and fencing counters \
                 are lost if the server evicts keys)"
            );
            return Ok(());
        }
    };
    match policy.as_deref() {
        None | Some("noeviction") => Ok(()),
        Some(policy) if allow_eviction => {
            tracing::warn!(
                node = shown,
                policy,
                "the server may evict keys; locks can vanish and fencing tokens can repeat"
            );
            Ok(())
        }
        Some(policy) => Err(Error::misconfigured(format!(
            "redis {shown}: maxmemory-policy is {policy}, so the server may evict live locks \
             or fencing counters; set it to noeviction (or accept the risk with \
             allow_eviction=true)"
        ))),
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
                self.answered = !needs_new_connection(&err);
                Err(into_error(err, what, &self.node.shown))
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
