//! Waiting until a started server serves, or reporting why it never did.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::error::io_error;
use super::{StoreProcess, StoreProcessError};

/// How often readiness is polled; short, because restarts happen inside timed scenarios.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Longest single readiness attempt, so one hung probe cannot use up the whole deadline.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

impl StoreProcess {
    pub(super) async fn wait_ready(&mut self) -> Result<(), StoreProcessError> {
        let started = Instant::now();
        let deadline = started + self.spec.ready_timeout;
        let addr = self.addr();
        let binary = self.binary.display().to_string();
        let mut last_error = None;
        loop {
            let exited = match &mut self.child {
                Some(child) => child
                    .try_wait()
                    .map_err(io_error("check the store process"))?,
                None => return Err(StoreProcessError::NotRunning),
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(StoreProcessError::Exited {
                    binary,
                    status,
                    log_tail: self.log_tail(),
                });
            }
            let attempt_start = Instant::now();
            let attempt_deadline = deadline.min(attempt_start + ATTEMPT_TIMEOUT);
            match tokio::time::timeout_at(attempt_deadline, self.check(addr)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(error)) => last_error = Some(error.to_string()),
                // An attempt cut short by the overall deadline tells less than the one before.
                Err(_) if attempt_deadline == deadline && last_error.is_some() => {}
                Err(_) => {
                    last_error = Some(format!("no answer within {:?}", attempt_start.elapsed()));
                }
            }
            if Instant::now() >= deadline {
                self.kill()?;
                return Err(StoreProcessError::NotReady {
                    binary,
                    addr,
                    waited: started.elapsed(),
                    last_error: last_error.unwrap_or_default(),
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn check(&self, addr: SocketAddr) -> io::Result<()> {
        drop(TcpStream::connect(addr).await?);
        match &self.spec.probe {
            Some(probe) => probe(addr).await,
            None => Ok(()),
        }
    }
}
