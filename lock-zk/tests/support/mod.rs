//! Shared by the lock-zk test targets: private servers, URLs and conformance factories.
//! Each target uses a different part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use conformance_tests::factory::DEFAULT_SHORTEST_TTL;
use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use conformance_tests::store_process::{
    free_port, StoreProcess, StoreSpec, ZookeeperPeer, ZOOKEEPER_MAX_SESSION_TIMEOUT_MS,
    ZOOKEEPER_MIN_SESSION_TIMEOUT_MS, ZOOKEEPER_TICK_MS,
};
use conformance_tests::ServerStore;
use lock_core::backend::DynBackend;

/// Starts a private standalone server; a missing server is an error, never a skip.
pub async fn start_zookeeper() -> StoreProcess {
    StoreProcess::start(StoreSpec::zookeeper())
        .await
        .unwrap_or_else(|err| panic!("cannot start ZooKeeper: {err}"))
}

/// Starts a private three-server ensemble on loopback (all members at once: each is ready
/// only once a quorum serves).
pub async fn start_ensemble() -> Vec<StoreProcess> {
    try_start_ensemble()
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn try_start_ensemble() -> Result<Vec<StoreProcess>, String> {
    let mut peers = Vec::new();
    for id in 1..=3u8 {
        peers.push(ZookeeperPeer {
            id,
            quorum_port: free_port().map_err(|e| e.to_string())?,
            election_port: free_port().map_err(|e| e.to_string())?,
        });
    }
    let (a, b, c) = tokio::join!(
        StoreProcess::start(StoreSpec::zookeeper_member(1, &peers)),
        StoreProcess::start(StoreSpec::zookeeper_member(2, &peers)),
        StoreProcess::start(StoreSpec::zookeeper_member(3, &peers)),
    );
    let started =
        |r: Result<StoreProcess, _>| r.map_err(|e| format!("cannot start ZooKeeper: {e}"));
    Ok(vec![started(a)?, started(b)?, started(c)?])
}

/// The options every test URL carries: the test servers' session limits and tick, and a
/// control session that notices a dead server quickly.
pub fn test_options() -> String {
    format!(
        "min_ttl_ms={ZOOKEEPER_MIN_SESSION_TIMEOUT_MS}&max_ttl_ms={ZOOKEEPER_MAX_SESSION_TIMEOUT_MS}&tick_ms={ZOOKEEPER_TICK_MS}&session_timeout_ms=4000"
    )
}

/// A URL for `addrs` with the test options and `extra` options (`"a=b&c=d"`, may be empty).
pub fn zk_url(addrs: &[SocketAddr], extra: &str) -> String {
    url_as("", addrs, extra)
}

/// [`zk_url`] with `user` (`"name:password@"`, or empty) before the hosts.
fn url_as(user: &str, addrs: &[SocketAddr], extra: &str) -> String {
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    let sep = if extra.is_empty() { "" } else { "&" };
    format!(
        "zk://{user}{}/?{}{sep}{extra}",
        hosts.join(","),
        test_options()
    )
}

/// Creates the default lock root at the servers at `addrs` as the digest user `app`, with
/// an ACL that lets only `app` use it; a URL as `app`.
async fn enable_auth(addrs: Vec<SocketAddr>) -> Result<String, String> {
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    let admin = zookeeper_client::Client::connector()
        .with_auth("digest", b"app:right-pass")
        .connect(&hosts.join(","))
        .await
        .map_err(|err| format!("connecting as app: {err}"))?;
    admin
        .create(
            "/distlock",
            &[],
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::creator_all()),
        )
        .await
        .map_err(|err| format!("creating the lock root: {err}"))?;
    Ok(url_as("app:right-pass@", &addrs, ""))
}

/// Connects a backend for `url`.
pub async fn connect(url: &str) -> DynBackend {
    lock_zk::connect(url).await.unwrap()
}

/// One private standalone server for the conformance suite.
pub const ZOOKEEPER: ServerStore = ServerStore {
    name: "zookeeper",
    start: || {
        Box::pin(async {
            let server = StoreProcess::start(StoreSpec::zookeeper())
                .await
                .map_err(|e| format!("cannot start ZooKeeper: {e}"))?;
            Ok(vec![server])
        })
    },
    ..ENSEMBLE
};

/// A private three-server ensemble for the conformance suite.
pub const ENSEMBLE: ServerStore = ServerStore {
    name: "zookeeper-ensemble",
    start: || Box::pin(try_start_ensemble()),
    url: zk_url,
    connect: |url| Box::pin(async move { lock_zk::connect(&url).await }),
    connect_lazily: None,
    link_options: "",
    unreachable_options: "",
    wrong_password: Some(|addrs, password| url_as(&format!("app:{password}@"), addrs, "")),
    // ZooKeeper takes any digest credential at connect and checks it against the ACLs of
    // each node: the scenario gives the lock root an ACL at private servers.
    enable_auth: Some(|addrs| Box::pin(enable_auth(addrs))),
    renewal_requests: None,
    shortest_ttl: DEFAULT_SHORTEST_TTL,
    // ZooKeeper ends a session only when its client closes it or its timeout passes
    // unpinged; ending it from outside takes its id and password, which lock-zk does not
    // expose, so the session-end scenario does not apply.
    end_session: None,
    // Path separators and segments, reserved names, escapes, and characters ZooKeeper
    // refuses in a path (private use, U+FFF0.., outside the Basic Multilingual Plane).
    hostile_keys: &[
        "/",
        "..",
        ".",
        "zookeeper",
        "a/../b",
        "%2F",
        "日本語",
        "😀",
        "\u{e000}",
        "\u{fff0}",
        " ",
        "*",
    ],
};

/// A three-server ensemble whose quorum links (each follower's connection to the leader)
/// run through fault proxies: `links[(from, to)]` carries member `from`'s connection to
/// member `to`'s quorum port, so one follower can be cut from the leader while clients
/// still reach it. Election links are direct.
pub struct ProxiedEnsemble {
    /// The members, `servers[i]` being member `i + 1`.
    pub servers: Vec<StoreProcess>,
    links: std::collections::HashMap<(u8, u8), TcpFaultProxy>,
}

impl ProxiedEnsemble {
    /// Starts the proxies, then the three members at once.
    pub async fn start() -> Self {
        let ports = || free_port().unwrap();
        let peers: Vec<ZookeeperPeer> = (1..=3u8)
            .map(|id| ZookeeperPeer {
                id,
                quorum_port: ports(),
                election_port: ports(),
            })
            .collect();
        let mut links = std::collections::HashMap::new();
        for from in &peers {
            for to in peers.iter().filter(|to| to.id != from.id) {
                let target = SocketAddr::from((Ipv4Addr::LOCALHOST, to.quorum_port));
                links.insert(
                    (from.id, to.id),
                    TcpFaultProxy::start(target).await.unwrap(),
                );
            }
        }
        // Each member sees the others' quorum ports through its own proxies.
        let view = |me: u8| -> Vec<ZookeeperPeer> {
            peers
                .iter()
                .map(|peer| match links.get(&(me, peer.id)) {
                    Some(proxy) => ZookeeperPeer {
                        quorum_port: proxy.addr().port(),
                        ..*peer
                    },
                    None => *peer,
                })
                .collect()
        };
        let (a, b, c) = tokio::join!(
            StoreProcess::start(StoreSpec::zookeeper_member(1, &view(1))),
            StoreProcess::start(StoreSpec::zookeeper_member(2, &view(2))),
            StoreProcess::start(StoreSpec::zookeeper_member(3, &view(3))),
        );
        let started = |r: Result<StoreProcess, _>| {
            r.unwrap_or_else(|e| panic!("cannot start ZooKeeper: {e}"))
        };
        ProxiedEnsemble {
            servers: vec![started(a), started(b), started(c)],
            links,
        }
    }

    /// The index in `servers` of the member in `mode` (`leader` or `follower`), waiting
    /// until one is.
    pub async fn member_in(&self, mode: &str) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            for (index, server) in self.servers.iter().enumerate() {
                if conformance_tests::store_process::zookeeper_mode(server.addr())
                    .await
                    .is_ok_and(|m| m == mode)
                {
                    return index;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {mode} in the ensemble"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sets the mode of member `from`'s link to member `to` (indexes in `servers`).
    pub fn link(&self, from: usize, to: usize, mode: ProxyMode) {
        let id = |index: usize| u8::try_from(index + 1).unwrap();
        self.links[&(id(from), id(to))].set_mode(mode);
    }
}
