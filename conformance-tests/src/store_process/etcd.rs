//! Ready-made etcd specs (single member and cluster members).
//!
//! Members run with fast raft timing, so a lease can be as short as 1 s (etcd keeps a lease
//! for at least 1.5 election timeouts): a single member with `--heartbeat-interval 10
//! --election-timeout 50`, cluster members with 50 and 500 ms, since a 50 ms election
//! timeout makes a cluster on a loaded two-core machine elect new leaders again and again
//! (requests then fail with "leader changed"). A killed leader is still replaced within a
//! second. etcd 3.4 has no `--unsafe-no-fsync`, so members always sync their log.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{free_port, StoreProcessError, StoreSpec};

/// Raft timing (heartbeat, election timeout) in milliseconds: a single member never
/// elects again, so it can be as fast as a lease of 1 s needs; a cluster's members are
/// given room for a loaded machine.
const SINGLE_TIMING: (&str, &str) = ("10", "50");
const CLUSTER_TIMING: (&str, &str) = ("50", "500");

/// One member of a test cluster: its name and peer ports, chosen before any member starts
/// because every member must name all its peers at its first start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdMember {
    /// The member's name in the cluster.
    pub name: String,
    /// The loopback port the member listens on for raft traffic.
    pub peer_port: u16,
    /// The port the other members send its raft traffic to: `peer_port`, or the port of
    /// a fault proxy in front of it (see [`EtcdMember::advertised_at`]).
    pub advertised_peer_port: u16,
}

impl EtcdMember {
    /// `count` members named `m0`, `m1`, ... on free peer ports.
    pub fn cluster(count: usize) -> Result<Vec<EtcdMember>, StoreProcessError> {
        (0..count)
            .map(|index| {
                let peer_port = free_port()?;
                Ok(EtcdMember {
                    name: format!("m{index}"),
                    peer_port,
                    advertised_peer_port: peer_port,
                })
            })
            .collect()
    }

    /// The same member, reached by the others on `port` (a proxy forwarding to its
    /// `peer_port`), so its links to its peers can be cut while clients still reach it.
    /// Every connection a peer opens to this member goes through that port; those it
    /// opens to its peers go through theirs.
    pub fn advertised_at(mut self, port: u16) -> Self {
        self.advertised_peer_port = port;
        self
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.advertised_peer_port)
    }

    fn listen_peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

impl StoreSpec {
    /// A single-member etcd cluster.
    pub fn etcd() -> Result<Self, StoreProcessError> {
        let member = EtcdMember::cluster(1)?.remove(0);
        Ok(StoreSpec::etcd_member(
            &member,
            std::slice::from_ref(&member),
        ))
    }

    /// `member` of the cluster `all` (which includes it). Start every member at once (they
    /// only report ready once a majority of them run and a leader is elected).
    pub fn etcd_member(member: &EtcdMember, all: &[EtcdMember]) -> Self {
        let initial_cluster: Vec<String> = all
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let initial_cluster = initial_cluster.join(",");
        let (name, peer_url) = (member.name.clone(), member.peer_url());
        let listen_peer_url = member.listen_peer_url();
        let (heartbeat, election) = if all.len() == 1 {
            SINGLE_TIMING
        } else {
            CLUSTER_TIMING
        };
        StoreSpec::new("etcd", "etcd-server")
            .args(move |port, dir| {
                let client_url = format!("http://127.0.0.1:{port}");
                [
                    "--name",
                    &name,
                    "--data-dir",
                    &dir.join("member").display().to_string(),
                    "--listen-client-urls",
                    &client_url,
                    "--advertise-client-urls",
                    &client_url,
                    "--listen-peer-urls",
                    &listen_peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                    "--initial-cluster",
                    &initial_cluster,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    "distlock-test",
                    "--heartbeat-interval",
                    heartbeat,
                    "--election-timeout",
                    election,
                    "--logger",
                    "zap",
                    "--log-level",
                    "warn",
                ]
                .into_iter()
                .map(str::to_owned)
                .collect()
            })
            .probe(etcd_health)
    }
}

/// etcd accepts connections before its cluster has a leader; `/health` says `true` only
/// once it can serve.
async fn etcd_health(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    let reply = String::from_utf8_lossy(&reply);
    if reply.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "/health answered {:?}",
            reply.lines().last().unwrap_or_default()
        )))
    }
}
