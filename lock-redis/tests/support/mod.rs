//! Shared by the lock-redis test targets: private servers, URLs and conformance factories.
//! Each target uses a different part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::factory::BoxFuture;
use conformance_tests::factory::{join_options, DEFAULT_SHORTEST_TTL};
use conformance_tests::proxy::TcpFaultProxy;
use conformance_tests::store_process::{StoreProcess, StoreSpec};
use conformance_tests::ServerStore;
use lock_core::backend::DynBackend;

/// How many nodes the Redlock tests run.
pub const REDLOCK_NODES: usize = 5;

/// Starts a private redis-server without persistence; a missing binary is an error, never
/// a skip.
pub async fn start_redis() -> StoreProcess {
    start(StoreSpec::redis()).await
}

/// Starts a private redis-server with `appendfsync always`.
pub async fn start_redis_aof() -> StoreProcess {
    start(StoreSpec::redis_aof()).await
}

async fn start(spec: StoreSpec) -> StoreProcess {
    try_start(spec).await.unwrap_or_else(|err| panic!("{err}"))
}

async fn try_start(spec: StoreSpec) -> Result<StoreProcess, String> {
    StoreProcess::start(spec)
        .await
        .map_err(|err| format!("cannot start redis-server: {err}"))
}

/// `n` private servers.
pub async fn start_redis_nodes(n: usize) -> Vec<StoreProcess> {
    try_start_nodes(n)
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn try_start_nodes(n: usize) -> Result<Vec<StoreProcess>, String> {
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(try_start(StoreSpec::redis()).await?);
    }
    Ok(servers)
}

/// A proxy in front of each address.
pub async fn proxies(targets: &[SocketAddr]) -> Vec<TcpFaultProxy> {
    let mut out = Vec::with_capacity(targets.len());
    for target in targets {
        out.push(TcpFaultProxy::start(*target).await.unwrap());
    }
    out
}

/// A single-node URL with extra options (`"a=b&c=d"`, may be empty).
pub fn redis_url(addr: SocketAddr, options: &str) -> String {
    format!("redis://{addr}/0?{options}")
}

/// A Redlock URL over `addrs` with extra options.
pub fn redlock_url(addrs: &[SocketAddr], options: &str) -> String {
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    format!("redis+redlock://{}/0?{options}", hosts.join(","))
}

/// A plain connection to a server, for setting it up and looking at it behind the
/// backend's back.
pub async fn raw(addr: SocketAddr) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}/0"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Runs `CONFIG SET name value` on the server at `addr`.
pub async fn config_set(addr: SocketAddr, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut raw(addr).await)
        .await
        .unwrap();
}

/// The Redis key of the lock on `key` under `prefix` (the layout documented in docs.md).
pub fn lock_key(prefix: &str, key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{{{hex}}}")
}

/// The lock entry stored under `redis_key` on the server at `addr`, if any.
pub async fn entry(addr: SocketAddr, redis_key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(redis_key)
        .query_async(&mut raw(addr).await)
        .await
        .unwrap()
}

/// Connects a backend for `url`, single node or Redlock.
pub async fn connect(url: &str) -> DynBackend {
    lock_redis::connect(url).await.unwrap()
}

/// The user the conformance servers know besides the default one, for the wrong-password
/// scenario.
const USER: &str = "distlock-test";

/// Starts `n` servers that also know [`USER`].
async fn start_with_user(n: usize) -> Result<Vec<StoreProcess>, String> {
    let servers = try_start_nodes(n).await?;
    for server in &servers {
        let mut admin = redis::Client::open(format!("redis://{}/0", server.addr()))
            .map_err(|err| err.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|err| err.to_string())?;
        let () = redis::cmd("ACL")
            .arg(&["SETUSER", USER, "on", ">right-pass", "~*", "&*", "+@all"][..])
            .query_async(&mut admin)
            .await
            .map_err(|err| err.to_string())?;
    }
    Ok(servers)
}

fn connect_url(url: String) -> BoxFuture<lock_core::Result<DynBackend>> {
    Box::pin(async move { lock_redis::connect(&url).await })
}

/// Script calls (every lock operation is one, a batch of renewals too) the server at
/// `server` has run.
fn evalsha_calls(server: SocketAddr) -> BoxFuture<Result<u64, String>> {
    Box::pin(command_calls(server, &["evalsha"]))
}

/// On a primary, its script calls; on a replica, the script effects it applied, each
/// batch of renewals one transaction (Redis propagates a script's writes as one
/// `MULTI`/`EXEC`), so a replica shows the same batching as its primary.
fn script_effects(server: SocketAddr) -> BoxFuture<Result<u64, String>> {
    Box::pin(command_calls(server, &["evalsha", "exec"]))
}

/// [`script_effects`] of a primary or replica; for a sentinel, those of the primary it
/// names, whose renewals the clients send through it.
fn effects_behind_sentinel(server: SocketAddr) -> BoxFuture<Result<u64, String>> {
    Box::pin(async move {
        let mut connection = redis::Client::open(format!("redis://{server}"))
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut connection)
            .await
            .map_err(|e| e.to_string())?;
        if role.first() != Some(&redis::Value::BulkString(b"sentinel".to_vec())) {
            return script_effects(server).await;
        }
        let (host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(SENTINEL_MASTER)
            .query_async(&mut connection)
            .await
            .map_err(|e| e.to_string())?;
        let primary = SocketAddr::new(host.parse().map_err(|_| host.clone())?, port);
        script_effects(primary).await
    })
}

/// How many times the server at `server` has run the commands `names`, together.
async fn command_calls(server: SocketAddr, names: &[&str]) -> Result<u64, String> {
    let raw = redis::Client::open(format!("redis://{server}/0")).map_err(|e| e.to_string())?;
    let mut connection = raw
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .map_err(|e| e.to_string())?;
    let mut total = 0;
    for name in names {
        let prefix = format!("cmdstat_{name}:calls=");
        let calls = info
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(Ok(0), |calls| {
                calls.parse::<u64>().map_err(|_| format!("calls={calls}?"))
            })?;
        total += calls;
    }
    Ok(total)
}

/// Key names that Redis, its glob patterns and the Lua scripts could treat specially:
/// glob characters, hash-tag braces, Lua code and the suffix of a fencing counter.
pub const HOSTILE_KEYS: &[&str] = &[
    "*",
    "a*",
    "?",
    "[a-z]",
    "[",
    "]",
    "\\*",
    "{",
    "}",
    "{tag}",
    "}{",
    "x{tag}y",
    "{}",
    "{a}{b}",
    "with space",
    " leading and trailing ",
    "ünïcødé 🔒",
    "日本語",
    "redis.call('FLUSHALL')",
    "--[[ lua ]]",
    "]] .. os.exit() .. [[",
    "%s%d%%",
    "'\"`",
    ":fence",
    "x}:fence",
];

/// One private server.
pub const REDIS: ServerStore = ServerStore {
    name: "redis",
    start: || Box::pin(start_with_user(1)),
    url: |addrs, options| redis_url(addrs[0], options),
    connect: connect_url,
    connect_lazily: None,
    link_options: "",
    unreachable_options: "",
    wrong_password: Some(|addrs, password| format!("redis://{USER}:{password}@{}/0", addrs[0])),
    enable_auth: None,
    renewal_requests: Some(evalsha_calls),
    shortest_ttl: DEFAULT_SHORTEST_TTL,
    end_session: None,
    hostile_keys: HOSTILE_KEYS,
};

/// A primary that knows [`USER`] and one replica in sync with it.
async fn start_primary_and_replica() -> Result<Vec<StoreProcess>, String> {
    let mut servers = start_with_user(1).await?;
    let replica = StoreProcess::start(StoreSpec::redis_replica_of(servers[0].port()))
        .await
        .map_err(|err| format!("cannot start the replica: {err}"))?;
    servers.push(replica);
    Ok(servers)
}

/// One private primary with one replica, every grant, renewal and record confirmed by it
/// (`replicas=1`); clients talk to the primary only.
pub const REDIS_REPLICATED: ServerStore = ServerStore {
    name: "redis-replicated",
    start: || Box::pin(start_primary_and_replica()),
    url: |addrs, options| redis_url(addrs[0], &join_options("replicas=1", options)),
    renewal_requests: Some(script_effects),
    ..REDIS
};

/// The name the fixture's sentinels monitor their primary under.
pub const SENTINEL_MASTER: &str = "distlock-primary";

/// A primary with two replicas and three sentinels (quorum 2) watching it, in this order:
/// `[primary, replica, replica, sentinel, sentinel, sentinel]`.
pub struct SentinelSetup {
    pub servers: Vec<StoreProcess>,
}

impl SentinelSetup {
    /// Starts the setup, with sentinels that declare a silent primary down after
    /// `down_after`; returns once every sentinel knows both replicas and both other
    /// sentinels, so a failover can be asked for or provoked at once.
    pub async fn start(down_after: Duration) -> SentinelSetup {
        let servers = try_start_sentinel_setup(down_after)
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        let setup = SentinelSetup { servers };
        let deadline = Instant::now() + Duration::from_secs(20);
        for sentinel in setup.sentinels() {
            loop {
                let known = sentinel_view(sentinel.addr()).await;
                if known.get("num-slaves").map(String::as_str) == Some("2")
                    && known.get("num-other-sentinels").map(String::as_str) == Some("2")
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {} does not know the whole setup: {known:?}",
                    sentinel.addr()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        setup
    }

    /// The three sentinels.
    pub fn sentinels(&self) -> &[StoreProcess] {
        &self.servers[3..]
    }

    /// The data servers: the first primary, then its two replicas.
    pub fn data_servers(&mut self) -> &mut [StoreProcess] {
        &mut self.servers[..3]
    }

    /// A `redis+sentinel://` URL over the sentinels with extra options.
    pub fn url(&self, options: &str) -> String {
        let addrs: Vec<SocketAddr> = self.servers.iter().map(StoreProcess::addr).collect();
        sentinel_url(&addrs, options)
    }

    /// The primary's address as the sentinels see it (the first one that answers).
    pub async fn primary(&self) -> SocketAddr {
        let mut connection = raw(self.sentinels()[0].addr()).await;
        let (host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(SENTINEL_MASTER)
            .query_async(&mut connection)
            .await
            .unwrap();
        SocketAddr::new(host.parse().unwrap(), port)
    }
}

/// What the sentinel at `addr` knows of the master (`SENTINEL MASTER`).
pub async fn sentinel_view(addr: SocketAddr) -> std::collections::HashMap<String, String> {
    redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(SENTINEL_MASTER)
        .query_async(&mut raw(addr).await)
        .await
        .unwrap()
}

/// A sentinel URL over the sentinels of a setup's addresses (see [`SentinelSetup`]).
pub fn sentinel_url(addrs: &[SocketAddr], options: &str) -> String {
    let hosts: Vec<String> = addrs[3..].iter().map(ToString::to_string).collect();
    format!(
        "redis+sentinel://{}/{SENTINEL_MASTER}/0?{options}",
        hosts.join(",")
    )
}

async fn try_start_sentinel_setup(down_after: Duration) -> Result<Vec<StoreProcess>, String> {
    let mut servers = start_with_user(1).await?;
    let primary = servers[0].port();
    for _ in 0..2 {
        let replica = StoreProcess::start(StoreSpec::redis_replica_of(primary))
            .await
            .map_err(|err| format!("cannot start a replica: {err}"))?;
        servers.push(replica);
    }
    for _ in 0..3 {
        let sentinel = StoreProcess::start(StoreSpec::redis_sentinel(
            primary,
            SENTINEL_MASTER,
            down_after,
        ))
        .await
        .map_err(|err| format!("cannot start a sentinel: {err}"))?;
        servers.push(sentinel);
    }
    Ok(servers)
}

/// Long enough that no failover starts while the conformance suite pauses or restarts the
/// servers.
const CONFORMANCE_DOWN_AFTER: Duration = Duration::from_secs(30);

/// A primary with two replicas found through three sentinels (`redis+sentinel://`), every
/// grant, renewal and record confirmed by one replica (`replicas=1`).
pub const REDIS_SENTINEL: ServerStore = ServerStore {
    name: "redis-sentinel",
    start: || Box::pin(try_start_sentinel_setup(CONFORMANCE_DOWN_AFTER)),
    url: |addrs, options| sentinel_url(addrs, &join_options("replicas=1", options)),
    wrong_password: Some(|addrs, password| {
        let hosts: Vec<String> = addrs[3..].iter().map(ToString::to_string).collect();
        format!(
            "redis+sentinel://{USER}:{password}@{}/{SENTINEL_MASTER}",
            hosts.join(",")
        )
    }),
    renewal_requests: Some(effects_behind_sentinel),
    ..REDIS
};

/// Five private servers under Redlock.
pub const REDLOCK: ServerStore = ServerStore {
    name: "redlock",
    start: || Box::pin(start_with_user(REDLOCK_NODES)),
    url: redlock_url,
    connect: connect_url,
    connect_lazily: None,
    // Node replies slower than the TTL but within the node time-out: the quorum answers,
    // too late.
    link_options: "node_timeout_ms=2000&response_timeout_ms=2000",
    unreachable_options: "node_timeout_ms=100",
    wrong_password: Some(|addrs, password| {
        let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        format!("redis+redlock://{USER}:{password}@{}/0", hosts.join(","))
    }),
    enable_auth: None,
    renewal_requests: Some(evalsha_calls),
    shortest_ttl: DEFAULT_SHORTEST_TTL,
    end_session: None,
    hostile_keys: HOSTILE_KEYS,
};
