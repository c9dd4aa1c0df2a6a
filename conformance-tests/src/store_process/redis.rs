//! Ready-made Redis specs and the check that tells a loading Redis from a serving one.

use std::io;
use std::net::SocketAddr;

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
}

fn redis_with(persistence: &'static [&'static str]) -> StoreSpec {
    StoreSpec::new("redis-server", "redis-server")
        .args(move |port, dir| {
            let (port, dir) = (port.to_string(), dir.display().to_string());
            let common = ["--port", &port, "--bind", "127.0.0.1", "--dir", &dir];
            let common = common.into_iter().chain(["--daemonize", "no"]);
            common
                .chain(persistence.iter().copied())
                .map(str::to_owned)
                .collect()
        })
        .probe(redis_ping)
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
