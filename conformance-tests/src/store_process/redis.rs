//! Ready-made Redis specs and the check that tells a loading Redis from a serving one.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::StoreSpec;

impl StoreSpec {
    /// `redis-server` without persistence: a restart starts empty.
    pub fn redis() -> Self {
        redis_with(&["--save", "", "--appendonly", "no"])
    }

    /// `redis-server` with an append-only file fsynced on every write, so every acknowledged
    /// write survives [`StoreProcess::kill`](super::StoreProcess::kill) and
    /// [`StoreProcess::restart`](super::StoreProcess::restart).
    pub fn redis_aof() -> Self {
        redis_with(&[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
    }

    /// `redis-server` without persistence, replicating the server on `127.0.0.1:primary`:
    /// ready only once the first sync is done and the primary counts it as an online
    /// replica, so a test can count on it from the start.
    pub fn redis_replica_of(primary: u16) -> Self {
        let primary_addr = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, primary));
        let primary = primary.to_string();
        redis_with(&["--save", "", "--appendonly", "no"])
            .args(move |port, dir| {
                let mut args = redis_args(port, dir, &["--save", "", "--appendonly", "no"]);
                args.extend(["--replicaof".into(), "127.0.0.1".into(), primary.clone()]);
                args
            })
            .probe(move |addr| redis_replica_synced(addr, primary_addr))
    }

    /// A Redis Sentinel (`redis-server --sentinel`) monitoring the primary on
    /// `127.0.0.1:primary` under the name `master`, with quorum 2 (run three), declaring the
    /// primary down after `down_after` without an answer and giving a failover 3 s. Its
    /// configuration file is written into the data directory (Sentinel rewrites it as it
    /// learns replicas, other sentinels and failovers, so a restart keeps what it knew);
    /// it announces itself on loopback.
    pub fn redis_sentinel(primary: u16, master: &str, down_after: Duration) -> Self {
        let config = format!(
            "sentinel announce-ip 127.0.0.1\n\
             sentinel monitor {master} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {master} {}\n\
             sentinel failover-timeout {master} 3000\n",
            down_after.as_millis()
        );
        StoreSpec::new("redis-server", "redis-server")
            .setup(move |dir| std::fs::write(dir.join(SENTINEL_CONFIG), &config))
            .args(|port, dir| {
                let config = dir.join(SENTINEL_CONFIG).display().to_string();
                let (port, dir) = (port.to_string(), dir.display().to_string());
                [
                    config.as_str(),
                    "--sentinel",
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    &dir,
                    "--daemonize",
                    "no",
                ]
                .into_iter()
                .map(str::to_owned)
                .collect()
            })
            .probe(redis_ping)
    }
}

/// The file a sentinel keeps its configuration in, in its data directory.
const SENTINEL_CONFIG: &str = "sentinel.conf";

fn redis_with(persistence: &'static [&'static str]) -> StoreSpec {
    StoreSpec::new("redis-server", "redis-server")
        .args(move |port, dir| redis_args(port, dir, persistence))
        .probe(redis_ping)
}

fn redis_args(port: u16, dir: &std::path::Path, persistence: &[&str]) -> Vec<String> {
    let (port, dir) = (port.to_string(), dir.display().to_string());
    let common = ["--port", &port, "--bind", "127.0.0.1", "--dir", &dir];
    // A replica syncs through a file: at once (a diskless sync first waits 5 s for others)
    // and with the command stream flowing as soon as it is listed online (after a diskless
    // sync Redis 7.0 holds the stream until the replica's first acknowledgement, up to a
    // second later, so a `WAIT` right after readiness would time out).
    let common = common
        .into_iter()
        .chain(["--daemonize", "no", "--repl-diskless-sync", "no"]);
    common
        .chain(persistence.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// Redis accepts connections while it is still loading its data set and answers `-LOADING`
/// meanwhile, so only `+PONG` means ready.
async fn redis_ping(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"PING\r\n").await?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    while !reply.ends_with(b"\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&buf[..n]);
    }
    if reply.starts_with(b"+PONG") {
        Ok(())
    } else {
        let reply = String::from_utf8_lossy(&reply);
        Err(io::Error::other(format!(
            "PING answered {:?}",
            reply.trim_end()
        )))
    }
}

/// Ready when serving and in sync with the primary at `primary`, as both see it: the
/// replica's `INFO replication` says `master_link_status:up` (`down` while it still loads
/// the primary's snapshot), and the primary's lists it as `state=online` (which it does
/// only once the replica has acknowledged, a little later), so a `WAIT` counts it at once.
async fn redis_replica_synced(addr: SocketAddr, primary: SocketAddr) -> io::Result<()> {
    redis_ping(addr).await?;
    if !redis_info(addr).await?.contains("master_link_status:up") {
        return Err(io::Error::other(
            "the replica's link to its primary is not up yet",
        ));
    }
    let listed = format!("port={},state=online", addr.port());
    if !redis_info(primary).await?.contains(&listed) {
        return Err(io::Error::other(
            "the primary does not list the replica online yet",
        ));
    }
    Ok(())
}

/// The server's `INFO replication` text.
async fn redis_info(addr: SocketAddr) -> io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"INFO replication\r\n").await?;
    // A bulk reply: `$<length>\r\n<text>\r\n`.
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = reply.windows(2).position(|w| w == b"\r\n") {
            let length: usize = String::from_utf8_lossy(&reply[1..end])
                .parse()
                .map_err(|_| io::Error::other("INFO answered no bulk string"))?;
            if reply.len() >= end + 2 + length {
                return Ok(String::from_utf8_lossy(&reply[end + 2..end + 2 + length]).into_owned());
            }
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&buf[..n]);
    }
}
