//! Shared by the lock-etcd test targets: private servers, URLs and conformance factories.
//! Each target uses a different part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::store_process::{EtcdMember, StoreProcess, StoreSpec};
use conformance_tests::{BackendFactory, LinkControl};
use lock_core::{async_trait, backend::DynBackend};
use lock_etcd::{EtcdBackend, EtcdConfig};

/// Options every test URL carries: the test servers keep 1 s leases.
pub const TEST_OPTIONS: &str = "min_ttl_ms=1000&connect_timeout_ms=500";

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
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!("&{extra}")
    };
    format!(
        "etcd://{}/distlock-test?{TEST_OPTIONS}{extra}",
        hosts.join(",")
    )
}

/// A loopback address nothing listens on.
pub fn closed_addr() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.local_addr().unwrap()
}

/// Connects a backend for `url`.
pub async fn connect(url: &str) -> DynBackend {
    lock_etcd::connect(url).await.unwrap()
}

/// Runs `etcdctl` against `endpoints` with `args`, returning its stdout; fails on a
/// non-zero exit.
pub async fn etcdctl(endpoints: &[SocketAddr], args: &[&str]) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    let output = tokio::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(args)
        .output()
        .await
        .expect("etcdctl must be installed (Debian package etcd-client)");
    assert!(
        output.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A client link through a TCP fault proxy: cutting it black-holes the connection.
pub struct ProxyLink(pub Arc<TcpFaultProxy>);

impl LinkControl for ProxyLink {
    fn cut(&self) {
        self.0.set_mode(ProxyMode::BlackHole);
    }

    fn restore(&self) {
        self.0.set_mode(ProxyMode::Pass);
    }

    fn delay_replies(&self, delay: Duration) {
        // The proxy holds back each chunk in each direction, and bytes that arrive while
        // one is held back wait for the next: half the delay each way keeps a reply within
        // about `delay` of the store applying the request.
        self.0.set_mode(ProxyMode::Delay(delay / 2));
    }
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

/// A conformance factory over servers it keeps alive.
pub struct EtcdFactory {
    name: &'static str,
    addrs: Vec<SocketAddr>,
    url: String,
    unreachable_url: String,
    _servers: Vec<StoreProcess>,
}

impl EtcdFactory {
    /// One private single-member etcd.
    pub async fn single() -> Result<Arc<dyn BackendFactory>, String> {
        Ok(Self::over("etcd", vec![try_start_etcd().await?]))
    }

    /// A private three-member cluster, used through all three endpoints.
    pub async fn cluster() -> Result<Arc<dyn BackendFactory>, String> {
        Ok(Self::over("etcd-cluster", try_start_cluster().await?))
    }

    fn over(name: &'static str, servers: Vec<StoreProcess>) -> Arc<dyn BackendFactory> {
        let addrs: Vec<SocketAddr> = servers.iter().map(StoreProcess::addr).collect();
        Arc::new(EtcdFactory {
            name,
            url: etcd_url(&addrs, ""),
            unreachable_url: etcd_url(&[closed_addr()], "request_timeout_ms=500"),
            addrs,
            _servers: servers,
        })
    }
}

#[async_trait]
impl BackendFactory for EtcdFactory {
    fn name(&self) -> String {
        self.name.to_string()
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        lock_etcd::connect(&self.url).await
    }

    async fn residue(&self, prefix: &str) -> lock_core::Result<Vec<String>> {
        let config = EtcdConfig::from_url(&self.url)?;
        EtcdBackend::connect(&config)
            .await?
            .stored_keys(prefix)
            .await
    }

    async fn connect_unreachable(&self) -> Option<lock_core::Result<DynBackend>> {
        Some(lock_etcd::connect(&self.unreachable_url).await)
    }

    async fn connect_with_link(
        &self,
    ) -> Option<lock_core::Result<(DynBackend, Arc<dyn LinkControl>)>> {
        // One proxied endpoint: every connection of the client goes through the link.
        let proxy = match TcpFaultProxy::start(self.addrs[0]).await {
            Ok(proxy) => Arc::new(proxy),
            Err(err) => {
                return Some(Err(lock_core::Error::new(
                    lock_core::ErrorKind::Internal,
                    format!("cannot start a proxy: {err}"),
                )))
            }
        };
        let url = etcd_url(&[proxy.addr()], "");
        Some(
            lock_etcd::connect(&url)
                .await
                .map(|backend| (backend, Arc::new(ProxyLink(proxy)) as Arc<dyn LinkControl>)),
        )
    }
}
