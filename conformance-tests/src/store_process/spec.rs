//! The description of one kind of store server. The ready-made descriptions live with
//! the rest of their store's knowledge (`redis.rs`, `postgres.rs`, `mariadb.rs`).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

type ArgsFn = dyn Fn(u16, &Path) -> Vec<String> + Send + Sync;
type SetupFn = dyn Fn(&Path) -> io::Result<()> + Send + Sync;
type ProbeFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;
type ProbeFn = dyn Fn(SocketAddr) -> ProbeFuture + Send + Sync;

/// How to run one kind of store server; build with [`StoreSpec::new`] and the setters.
pub struct StoreSpec {
    pub(super) binary: PathBuf,
    pub(super) package: String,
    pub(super) args: Box<ArgsFn>,
    pub(super) env: Vec<(String, String)>,
    pub(super) setup: Option<Box<SetupFn>>,
    pub(super) probe: Option<Box<ProbeFn>>,
    pub(super) ready_timeout: Duration,
    pub(super) run_as: Option<String>,
}

impl StoreSpec {
    /// A server run from `binary` (a name looked up in `PATH` and the sbin directories, or a
    /// path), installed by the Debian package `package`, which is named when it is missing.
    pub fn new(binary: impl Into<PathBuf>, package: impl Into<String>) -> Self {
        Self {
            binary: binary.into(),
            package: package.into(),
            args: Box::new(|_, _| Vec::new()),
            env: Vec::new(),
            setup: None,
            probe: None,
            ready_timeout: Duration::from_secs(20),
            run_as: None,
        }
    }

    /// Runs the server as the system user `user` (for servers that refuse to run as root,
    /// such as PostgreSQL). The temporary and data directories are handed to that user
    /// before the setup step, which must itself drop privileges for the commands it runs
    /// (see [`system_user`](super::system_user)). Without root privileges this does nothing.
    pub fn run_as(mut self, user: impl Into<String>) -> Self {
        self.run_as = Some(user.into());
        self
    }

    /// The command-line arguments for a given port and data directory. Called on every
    /// start, so a restart passes the same port and directory again.
    pub fn args(
        mut self,
        args: impl Fn(u16, &Path) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.args = Box::new(args);
        self
    }

    /// Adds an environment variable for the server.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// A step run once with the empty data directory before the first start (e.g. `initdb`).
    pub fn setup(
        mut self,
        setup: impl Fn(&Path) -> io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.setup = Some(Box::new(setup));
        self
    }

    /// A check that must pass, after a TCP connect succeeds, before the server counts as
    /// ready; retried until the readiness timeout. Stores that accept connections before they
    /// can serve (loading data, recovering) need one.
    pub fn probe<F, Fut>(mut self, probe: F) -> Self
    where
        F: Fn(SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<()>> + Send + 'static,
    {
        self.probe = Some(Box::new(move |addr| Box::pin(probe(addr))));
        self
    }

    /// How long a start or restart may take before it fails with
    /// [`StoreProcessError::NotReady`](super::StoreProcessError::NotReady).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }
}

impl fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreSpec")
            .field("binary", &self.binary)
            .field("package", &self.package)
            .field("env", &self.env)
            .field("setup", &self.setup.is_some())
            .field("probe", &self.probe.is_some())
            .field("ready_timeout", &self.ready_timeout)
            .field("run_as", &self.run_as)
            .finish_non_exhaustive()
    }
}
