//! Ready-made ZooKeeper specs (standalone server and ensemble members).
//!
//! ZooKeeper runs on the JVM from Debian's `zookeeper` package, started directly with
//! `java ... QuorumPeerMain <config>`: the config file is written into the fixture's
//! directory on every start (so a restart on the same port finds the same settings), binds
//! the client port to 127.0.0.1 only, turns the admin HTTP server off, and uses a short
//! tick so sessions can expire in a few hundred milliseconds. Container nodes are checked
//! every 100 ms so the reaping of empty lock parents is exercised (at most 1,000 a second,
//! so reaping the parents of ten thousand keys does not stall the server for the next
//! test), and the transaction log is not fsynced (a test server's durability across
//! `kill -9` comes from the page cache).

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::StoreSpec;

/// The server's jar; its manifest names the jars it depends on.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// The shortest session timeout the test servers grant, in milliseconds.
pub const ZOOKEEPER_MIN_SESSION_TIMEOUT_MS: u64 = 200;
/// The longest session timeout the test servers grant, in milliseconds: two minutes of TTL
/// plus the one tick a client adds to its sessions' timeouts.
pub const ZOOKEEPER_MAX_SESSION_TIMEOUT_MS: u64 = 120_000 + ZOOKEEPER_TICK_MS;
/// The test servers' `tickTime`, in milliseconds.
pub const ZOOKEEPER_TICK_MS: u64 = 100;

/// One member of a ZooKeeper ensemble on loopback: its id and the quorum and election
/// ports every member must know before any starts (choose them with
/// [`free_port`](super::free_port)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZookeeperPeer {
    /// The member's `myid` (1..=255).
    pub id: u8,
    /// The port followers use to talk to the leader.
    pub quorum_port: u16,
    /// The port of leader election.
    pub election_port: u16,
}

impl StoreSpec {
    /// A standalone ZooKeeper server (`java` running `QuorumPeerMain` from the Debian
    /// package `zookeeper`).
    pub fn zookeeper() -> Self {
        zookeeper_with(None, Vec::new(), true)
    }

    /// A standalone ZooKeeper server as it comes, without TTL nodes (no
    /// `-Dzookeeper.extendedTypesEnabled=true`), for tests of what needs them.
    pub fn zookeeper_without_ttl_nodes() -> Self {
        zookeeper_with(None, Vec::new(), false)
    }

    /// Member `id` of the ensemble `peers` (which must contain it). Start every member at
    /// once (the readiness probe of one member passes only once a quorum serves).
    ///
    /// The member binds the ports of its own entry and reaches the others at theirs, so
    /// each member may be given its own view, listing other members at fault proxies in
    /// front of their quorum ports (to cut one follower from the leader).
    pub fn zookeeper_member(id: u8, peers: &[ZookeeperPeer]) -> Self {
        zookeeper_with(Some(id), peers.to_vec(), true)
    }
}

fn zookeeper_with(member: Option<u8>, peers: Vec<ZookeeperPeer>, ttl_nodes: bool) -> StoreSpec {
    StoreSpec::new("java", "zookeeper")
        .setup(move |data_dir| {
            if !Path::new(ZOOKEEPER_JAR).is_file() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{ZOOKEEPER_JAR} is missing: install the Debian package `zookeeper`"),
                ));
            }
            match member {
                Some(id) => std::fs::write(data_dir.join("myid"), format!("{id}\n")),
                None => Ok(()),
            }
        })
        .args(move |port, data_dir| {
            let config = data_dir.join("zoo.cfg");
            // Written on every start: a retry on another port must not keep the old one.
            if let Err(err) = std::fs::write(&config, config_text(port, data_dir, &peers)) {
                tracing::warn!(%err, "cannot write the ZooKeeper config");
            }
            [
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Dznode.container.checkIntervalMs=100",
                "-Dznode.container.maxPerMinute=60000",
                "-Dzookeeper.forceSync=no",
                "-Dzookeeper.admin.enableServer=false",
                // TTL nodes, for idempotency records.
                if ttl_nodes {
                    "-Dzookeeper.extendedTypesEnabled=true"
                } else {
                    "-Dzookeeper.extendedTypesEnabled=false"
                },
                "-cp",
                ZOOKEEPER_JAR,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ]
            .into_iter()
            .map(str::to_owned)
            .chain([config.display().to_string()])
            .collect()
        })
        .probe(|addr| async move {
            let mode = zookeeper_mode(addr).await?;
            if mode == "standalone" || mode == "leader" || mode == "follower" {
                Ok(())
            } else {
                Err(io::Error::other(format!("ZooKeeper is in mode {mode:?}")))
            }
        })
        .ready_timeout(std::time::Duration::from_secs(60))
}

fn config_text(port: u16, data_dir: &Path, peers: &[ZookeeperPeer]) -> String {
    let mut text = format!(
        "tickTime={ZOOKEEPER_TICK_MS}\n\
         initLimit=50\n\
         syncLimit=20\n\
         minSessionTimeout={ZOOKEEPER_MIN_SESSION_TIMEOUT_MS}\n\
         maxSessionTimeout={ZOOKEEPER_MAX_SESSION_TIMEOUT_MS}\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr\n\
         maxClientCnxns=0\n",
        data_dir.display()
    );
    for peer in peers {
        // Infallible: writing to a String.
        let _ = writeln!(
            text,
            "server.{}=127.0.0.1:{}:{}",
            peer.id, peer.quorum_port, peer.election_port
        );
    }
    text
}

/// What ZooKeeper's `srvr` command says the server at `addr` is: `standalone`, `leader`
/// or `follower` while it serves (an error while it does not).
pub async fn zookeeper_mode(addr: SocketAddr) -> io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"srvr").await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    reply
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_string())
        .ok_or_else(|| io::Error::other(format!("srvr answered {:?}", reply.trim())))
}
