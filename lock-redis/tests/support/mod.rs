//! Shared by the lock-redis test targets: private servers, URLs and conformance factories.
//! Each target uses a different part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;

use conformance_tests::proxy::TcpFaultProxy;
use conformance_tests::store_process::{StoreProcess, StoreSpec};
use conformance_tests::BackendFactory;
use lock_core::{async_trait, backend::DynBackend};
use lock_redis::{RedisBackend, RedisConfig, RedlockBackend};

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

/// A loopback address nothing listens on.
pub fn closed_addr() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.local_addr().unwrap()
}

/// Connects a backend for `url`, single node or Redlock.
pub async fn connect(url: &str) -> DynBackend {
    lock_redis::connect(url).await.unwrap()
}

/// Keys under `prefix` with lock entries left, on whatever `url` names.
pub async fn stored_keys(url: &str, prefix: &str) -> lock_core::Result<Vec<String>> {
    let config = RedisConfig::from_url(url)?;
    if config.is_redlock() {
        RedlockBackend::connect(&config)
            .await?
            .stored_keys(prefix)
            .await
    } else {
        RedisBackend::connect(&config)
            .await?
            .stored_keys(prefix)
            .await
    }
}

/// A conformance factory over servers it keeps alive.
pub struct RedisFactory {
    name: &'static str,
    url: String,
    unreachable_url: String,
    _servers: Vec<StoreProcess>,
}

impl RedisFactory {
    /// One private server.
    pub async fn single() -> Result<Arc<dyn BackendFactory>, String> {
        let server = try_start(StoreSpec::redis()).await?;
        Ok(Arc::new(RedisFactory {
            name: "redis",
            url: redis_url(server.addr(), ""),
            unreachable_url: redis_url(closed_addr(), "connect_timeout_ms=200"),
            _servers: vec![server],
        }))
    }

    /// Five private servers under Redlock.
    pub async fn redlock() -> Result<Arc<dyn BackendFactory>, String> {
        let servers = try_start_nodes(REDLOCK_NODES).await?;
        let addrs: Vec<SocketAddr> = servers.iter().map(StoreProcess::addr).collect();
        let closed: Vec<SocketAddr> = (0..REDLOCK_NODES).map(|_| closed_addr()).collect();
        Ok(Arc::new(RedisFactory {
            name: "redlock",
            url: redlock_url(&addrs, ""),
            unreachable_url: redlock_url(&closed, "connect_timeout_ms=200&node_timeout_ms=100"),
            _servers: servers,
        }))
    }
}

#[async_trait]
impl BackendFactory for RedisFactory {
    fn name(&self) -> String {
        self.name.to_string()
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        lock_redis::connect(&self.url).await
    }

    async fn residue(&self, prefix: &str) -> lock_core::Result<Vec<String>> {
        stored_keys(&self.url, prefix).await
    }

    async fn connect_unreachable(&self) -> Option<lock_core::Result<DynBackend>> {
        Some(lock_redis::connect(&self.unreachable_url).await)
    }
}
