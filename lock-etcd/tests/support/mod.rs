//! Shared by the lock-etcd test targets: private servers, URLs and conformance factories.
//! Each target uses a different part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use conformance_tests::factory::{BoxFuture, DEFAULT_SHORTEST_TTL};
use conformance_tests::proxy::TcpFaultProxy;
use conformance_tests::store_process::{EtcdMember, StoreProcess, StoreSpec};
use conformance_tests::ServerStore;
use lock_core::backend::DynBackend;
use lock_etcd::EtcdConfig;

/// Options every test URL carries: the test servers keep 1 s leases.
pub const TEST_OPTIONS: &str = "min_ttl_ms=1000";

/// Starts a private single-member etcd; a missing binary is an error, never a skip.
pub async fn start_etcd() -> StoreProcess {
    try_start_etcd().await.unwrap_or_else(|err| panic!("{err}"))
}

async fn try_start_etcd() -> Result<StoreProcess, String> {
    let spec = StoreSpec::etcd().map_err(|err| err.to_string())?;
    StoreProcess::start(spec)
        .await
        .map_err(|err| format!("cannot start etcd: {err}"))
}

/// A private three-member cluster on loopback, started together.
pub async fn start_cluster() -> Vec<StoreProcess> {
    try_start_cluster()
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn try_start_cluster() -> Result<Vec<StoreProcess>, String> {
    let members = EtcdMember::cluster(3).map_err(|err| err.to_string())?;
    let starts = members
        .iter()
        .map(|member| StoreProcess::start(StoreSpec::etcd_member(member, &members)));
    futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|started| started.map_err(|err| format!("cannot start an etcd member: {err}")))
        .collect()
}

/// A private three-member cluster whose raft links run through fault proxies: every
/// connection a member opens to member `i` goes through `proxies[i]`, so black-holing it
/// cuts `i` off from what its peers send it and from answering them on their
/// connections, while its clients still reach it on its client port. (Connections that
/// `i` opens to its peers go through their proxies and stay up: with one advertised URL
/// per member, etcd gives no finer cut.)
pub async fn start_cluster_with_peer_proxies() -> (Vec<StoreProcess>, Vec<Arc<TcpFaultProxy>>) {
    let mut members = EtcdMember::cluster(3).unwrap();
    let peer_ports: Vec<u16> = members.iter().map(|m| m.peer_port).collect();
    let mut proxies = Vec::new();
    for member in &mut members {
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, member.peer_port));
        // The peer ports are free but not yet bound: a proxy must not take one.
        let proxy = loop {
            let proxy = TcpFaultProxy::start(target).await.unwrap();
            if !peer_ports.contains(&proxy.addr().port()) {
                break proxy;
            }
        };
        *member = member.clone().advertised_at(proxy.addr().port());
        proxies.push(Arc::new(proxy));
    }
    let starts = members
        .iter()
        .map(|member| StoreProcess::start(StoreSpec::etcd_member(member, &members)));
    let servers = futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|started| started.unwrap_or_else(|err| panic!("cannot start an etcd member: {err}")))
        .collect();
    (servers, proxies)
}

/// A URL over `addrs` with the test options and `extra` (`"a=b"`, may be empty).
pub fn etcd_url(addrs: &[SocketAddr], extra: &str) -> String {
    url_as("", addrs, extra)
}

/// [`etcd_url`] with `user` (`"name:password@"`, or empty) before the hosts.
fn url_as(user: &str, addrs: &[SocketAddr], extra: &str) -> String {
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    // The connect time-out stays the default: a member's status took longer than 500 ms
    // to read on a loaded machine, and every scenario connecting then failed.
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!("&{extra}")
    };
    format!(
        "etcd://{user}{}/distlock-test?{TEST_OPTIONS}{extra}",
        hosts.join(",")
    )
}

/// Connects a backend for `url`.
pub async fn connect(url: &str) -> DynBackend {
    lock_etcd::connect(url).await.unwrap()
}

/// Runs `etcdctl` against `endpoints` with `args`, returning its stdout; fails on a
/// non-zero exit.
pub async fn etcdctl(endpoints: &[SocketAddr], args: &[&str]) -> String {
    try_etcdctl(endpoints, args)
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn try_etcdctl(endpoints: &[SocketAddr], args: &[&str]) -> Result<String, String> {
    let endpoints: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    let output = tokio::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(args)
        .output()
        .await
        .map_err(|err| format!("etcdctl must be installed (Debian package etcd-client): {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Adds the user `root` to the cluster at `addrs` and switches authentication on; a URL
/// as `root`.
async fn enable_auth(addrs: Vec<SocketAddr>) -> Result<String, String> {
    try_etcdctl(
        &addrs,
        &["user", "add", "root:R00t-pass", "--interactive=false"],
    )
    .await?;
    try_etcdctl(&addrs, &["auth", "enable"]).await?;
    Ok(url_as("root:R00t-pass@", &addrs, ""))
}

/// Which of `addrs` leads the cluster now (by the members' own status).
pub async fn leader(addrs: &[SocketAddr]) -> lock_core::Result<usize> {
    for (index, addr) in addrs.iter().enumerate() {
        let status = async {
            etcd_client::Client::connect([addr.to_string()], None)
                .await?
                .status()
                .await
        };
        if let Ok(status) = status.await {
            if status.header().map(|h| h.member_id()) == Some(status.leader()) {
                return Ok(index);
            }
        }
    }
    Err(lock_core::Error::new(
        lock_core::ErrorKind::Unavailable,
        "no etcd member says it leads",
    ))
}

/// One private single-member etcd for the conformance suite.
pub const ETCD: ServerStore = ServerStore {
    name: "etcd",
    start: || Box::pin(async { Ok(vec![try_start_etcd().await?]) }),
    ..CLUSTER
};

/// A private three-member cluster for the conformance suite, used through all three
/// endpoints.
pub const CLUSTER: ServerStore = ServerStore {
    name: "etcd-cluster",
    start: || Box::pin(try_start_cluster()),
    url: etcd_url,
    connect: |url| Box::pin(async move { lock_etcd::connect(&url).await }),
    connect_lazily: None,
    link_options: "",
    // The connect time-out decides, however long the request time-out is.
    unreachable_options: "request_timeout_ms=5000",
    wrong_password: Some(|addrs, password| url_as(&format!("root:{password}@"), addrs, "")),
    // Authentication is for the whole server: the scenario switches it on at private ones.
    enable_auth: Some(|addrs| Box::pin(enable_auth(addrs))),
    renewal_requests: None,
    shortest_ttl: DEFAULT_SHORTEST_TTL,
    end_session: Some(revoke_holders_lease),
    // A key's directory must not cover another's (`a` and `a/b`, the etcd-mutex layout's
    // trap), and a prefix ending in the last character has no successor of its length
    // (the range end of a listing).
    hostile_keys: &["a/b", "a/", "/", "\u{10ffff}"],
};

/// Ends the session holding `key` as etcd ends one it has given up on: a second client
/// revokes the etcd lease of the key's owner entry (the lowest create revision in the key's
/// directory, `<prefix>/<hex of the key>/` in the distlock layout).
fn revoke_holders_lease(url: String, key: String) -> BoxFuture<lock_core::Result<()>> {
    Box::pin(async move {
        let config = EtcdConfig::from_url(&url)?;
        let hex: String = key.bytes().map(|byte| format!("{byte:02x}")).collect();
        let dir = format!("{}/{hex}/", config.prefix.trim_end_matches('/'));
        let failed = |what: &'static str| {
            move |err: etcd_client::Error| {
                lock_core::Error::new(lock_core::ErrorKind::Unavailable, format!("{what}: {err}"))
            }
        };
        let mut client = etcd_client::Client::connect(config.endpoints(), None)
            .await
            .map_err(failed("connecting to revoke a lease"))?;
        let entries = client
            .get(dir, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .map_err(failed("reading the key's entries"))?;
        let owner = entries
            .kvs()
            .iter()
            .min_by_key(|kv| kv.create_revision())
            .ok_or_else(|| {
                lock_core::Error::new(
                    lock_core::ErrorKind::InvalidInput,
                    format!("nobody holds {key:?}"),
                )
            })?;
        client
            .lease_revoke(owner.lease())
            .await
            .map_err(failed("revoking the holder's lease"))?;
        Ok(())
    })
}

/// What a test's tracing subscriber wrote (each test installing one runs in a binary of
/// its own: the subscriber is the process's global one).
#[derive(Clone, Default)]
pub struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
