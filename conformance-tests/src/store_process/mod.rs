//! A fixture that runs a real store server on a private port with a private data directory.
//!
//! Scenarios about crashes, stalls and restarts need to do to the store what production
//! does to it: freeze it ([`StoreProcess::pause`]), kill it ([`StoreProcess::kill`]) and bring
//! it back on the same address with the same data ([`StoreProcess::restart`]). A
//! [`StoreSpec`] describes how to run one kind of server: [`StoreSpec::redis`],
//! [`StoreSpec::postgres`] and [`StoreSpec::mariadb`] are ready-made.
//!
//! The server runs in its own process group and is signalled as a group, together with
//! every descendant that left the group (PostgreSQL backends call `setsid`), so servers
//! that fork workers are paused and killed as a whole. The flip side is that a
//! terminal's Ctrl-C does not reach it; the fixture kills it on drop instead.

mod binary;
mod error;
mod etcd;
mod log;
mod mariadb;
mod postgres;
mod privileges;
mod readiness;
mod redis;
mod signals;
mod spec;
mod zookeeper;

use std::fs::{self, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;

pub use error::StoreProcessError;
pub use etcd::EtcdMember;
pub use mariadb::{MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER};
pub use postgres::POSTGRES_PASSWORD;
pub use privileges::system_user;
pub use spec::StoreSpec;
pub use zookeeper::{
    zookeeper_mode, ZookeeperPeer, ZOOKEEPER_MAX_SESSION_TIMEOUT_MS,
    ZOOKEEPER_MIN_SESSION_TIMEOUT_MS, ZOOKEEPER_TICK_MS,
};

use binary::{missing, resolve_binary};
use error::io_error;
use privileges::spec_ids;
use signals::{descendants, signal_each, signal_group, signal_tree, wait_until_gone};

/// Extra first-start attempts on fresh ports, for when another process takes the chosen port
/// between our probe bind and the server's bind.
const PORT_RETRIES: usize = 3;

/// A running store server on `127.0.0.1:<port>` with its own temporary data directory.
///
/// The port and the directory stay the same for the fixture's life, so a restart finds its
/// data where it left it. Dropping the fixture kills the server and deletes the directory.
#[derive(Debug)]
pub struct StoreProcess {
    spec: StoreSpec,
    binary: PathBuf,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl StoreProcess {
    /// Prepares a data directory, runs the spec's setup step, starts the server on a free port
    /// and waits until it is ready.
    pub async fn start(spec: StoreSpec) -> Result<Self, StoreProcessError> {
        let binary = resolve_binary(&spec)?;
        let dir = tempfile::Builder::new()
            .prefix("distlock-store-")
            .tempdir()
            .map_err(io_error("create the store's temporary directory"))?;
        let data_dir = dir.path().join("data");
        fs::create_dir(&data_dir).map_err(io_error("create the store's data directory"))?;
        if let Some((uid, gid)) = spec_ids(&spec)? {
            for path in [dir.path(), data_dir.as_path()] {
                chown(path, Some(uid), Some(gid)).map_err(io_error(format!(
                    "hand {} to the server's user",
                    path.display()
                )))?;
            }
        }
        if let Some(setup) = &spec.setup {
            setup(&data_dir).map_err(io_error(format!("set up {}", binary.display())))?;
        }
        let mut store = Self {
            spec,
            binary,
            port: 0,
            dir,
            child: None,
        };
        let mut retries = 0;
        loop {
            store.port = free_port()?;
            match store.launch().await {
                // An early exit is most often a lost race for the port; other causes fail
                // again the same way and are reported after the last retry.
                Err(StoreProcessError::Exited { status, .. }) if retries < PORT_RETRIES => {
                    retries += 1;
                    tracing::debug!(port = store.port, %status, "store exited at start; retrying");
                }
                result => return result.map(|()| store),
            }
        }
    }

    /// The port the server listens on, the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's process id (its process-group id too), or `None` once it was killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The directory the server keeps its data in.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The end of the server's combined stdout/stderr log, across restarts.
    pub fn log_tail(&self) -> String {
        log::read_tail(&self.log_path())
    }

    /// Freezes the server (SIGSTOP): connections stay open and the kernel still accepts new
    /// ones, but nothing is answered, like a long GC pause or a stalled VM.
    pub fn pause(&self) -> Result<(), StoreProcessError> {
        self.signal(libc::SIGSTOP, "pause")
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) -> Result<(), StoreProcessError> {
        self.signal(libc::SIGCONT, "resume")
    }

    /// Kills the server without warning (SIGKILL) and reaps it; doing nothing if it is not
    /// running. Works on a paused server too.
    pub fn kill(&mut self) -> Result<(), StoreProcessError> {
        let Some(child) = &mut self.child else {
            return Ok(());
        };
        let strays = descendants(child.id());
        match signal_group(child.id(), libc::SIGKILL) {
            // ESRCH: the whole group is already gone, only reaping is left.
            Err(error) if error.raw_os_error() != Some(libc::ESRCH) => {
                return Err(io_error("kill the store process group")(error));
            }
            _ => {}
        }
        signal_each(&strays, libc::SIGKILL);
        child.wait().map_err(io_error("reap the store process"))?;
        self.child = None;
        // Workers that left the group are not our children, so nothing reaps them here;
        // until they are gone they may keep the server's resources (PostgreSQL's shared
        // memory), and a restart would be refused.
        wait_until_gone(&strays);
        Ok(())
    }

    /// Kills the server if it runs, starts it again on the same port with the same data
    /// directory, and waits until it is ready.
    pub async fn restart(&mut self) -> Result<(), StoreProcessError> {
        self.kill()?;
        // A worker forked just before the kill may outlive it for a moment and hold the
        // old server's shared memory; PostgreSQL then refuses to start until it exits
        // (which it does once it notices the server is gone).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch().await {
                Err(StoreProcessError::Exited { ref log_tail, .. })
                    if log_tail.contains("pre-existing shared memory block")
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }

    fn signal(&self, signal: libc::c_int, action: &str) -> Result<(), StoreProcessError> {
        let child = self.child.as_ref().ok_or(StoreProcessError::NotRunning)?;
        signal_tree(child.id(), signal).map_err(io_error(format!("{action} the store process")))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    async fn launch(&mut self) -> Result<(), StoreProcessError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io_error("open the store's log file"))?;
        let stderr = log
            .try_clone()
            .map_err(io_error("open the store's log file"))?;
        let data_dir = self.data_dir();
        let mut command = Command::new(&self.binary);
        if let Some((uid, gid)) = spec_ids(&self.spec)? {
            command.uid(uid).gid(gid);
        }
        let child = command
            .args((self.spec.args)(self.port, &data_dir))
            .envs(self.spec.env.iter().map(|(key, value)| (key, value)))
            .current_dir(&data_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|source| match source.kind() {
                io::ErrorKind::NotFound => missing(&self.spec),
                _ => io_error(format!("start {}", self.binary.display()))(source),
            })?;
        tracing::debug!(binary = %self.binary.display(), port = self.port, pid = child.id(), "store started");
        self.child = Some(child);
        self.wait_ready().await
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        if let Err(error) = self.kill() {
            tracing::warn!(%error, port = self.port, "could not kill the store process");
        }
    }
}

/// Asks the kernel for a free loopback port. Another process can take it before the server
/// binds; [`StoreProcess::start`] retries for that case. Clusters use it to choose their
/// members' peer ports before any member starts.
pub fn free_port() -> Result<u16, StoreProcessError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map_err(io_error("find a free port"))?;
    Ok(listener.port())
}
