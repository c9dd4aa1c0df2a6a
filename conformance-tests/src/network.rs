//! Network addresses for fault scenarios: ones nothing listens on, and ones that accept
//! and never answer.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::failure::Failure;
use crate::store_process::free_port;

/// A loopback address nothing listens on.
pub fn closed_addr() -> Result<SocketAddr, Failure> {
    let port = free_port().map_err(|err| Failure(format!("no free port: {err}")))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A listener that accepts every connection and keeps it open without reading or writing
/// a byte (a hung server); it stops when dropped.
pub struct MuteListener {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MuteListener {
    /// Starts listening on a free loopback port.
    pub async fn start() -> Result<Self, Failure> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| Failure(format!("cannot start a mute listener: {err}")))?;
        let addr = listener
            .local_addr()
            .map_err(|err| Failure(format!("mute listener: {err}")))?;
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        Ok(MuteListener { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MuteListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
