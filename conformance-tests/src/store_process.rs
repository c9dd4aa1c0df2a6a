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

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How often readiness is polled; short, because restarts happen inside timed scenarios.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Longest single readiness attempt, so one hung probe cannot use up the whole deadline.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Extra first-start attempts on fresh ports, for when another process takes the chosen port
/// between our probe bind and the server's bind.
const PORT_RETRIES: usize = 3;
/// How much of the end of the server's log an error quotes.
const LOG_TAIL_BYTES: u64 = 4096;

type ArgsFn = dyn Fn(u16, &Path) -> Vec<String> + Send + Sync;
type SetupFn = dyn Fn(&Path) -> io::Result<()> + Send + Sync;
type ProbeFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;
type ProbeFn = dyn Fn(SocketAddr) -> ProbeFuture + Send + Sync;

/// How to run one kind of store server; build with [`StoreSpec::new`] and the setters.
pub struct StoreSpec {
    binary: PathBuf,
    package: String,
    args: Box<ArgsFn>,
    env: Vec<(String, String)>,
    setup: Option<Box<SetupFn>>,
    probe: Option<Box<ProbeFn>>,
    ready_timeout: Duration,
    run_as: Option<String>,
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
    /// (see [`system_user`]). Without root privileges this does nothing.
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
    /// [`StoreProcessError::NotReady`].
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// `redis-server` without persistence: a restart starts empty.
    pub fn redis() -> Self {
        redis_with(&["--save", "", "--appendonly", "no"])
    }

    /// `redis-server` with an append-only file fsynced on every write, so every acknowledged
    /// write survives [`StoreProcess::kill`] and [`StoreProcess::restart`].
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

/// The superuser password of [`StoreSpec::postgres`] servers (user `postgres`).
pub const POSTGRES_PASSWORD: &str = "distlock-test";
/// The database, user and password [`StoreSpec::mariadb`] creates besides `root` (which
/// has an empty password over TCP).
pub const MARIADB_DATABASE: &str = "distlock";
/// See [`MARIADB_DATABASE`].
pub const MARIADB_USER: &str = "distlock";
/// See [`MARIADB_DATABASE`].
pub const MARIADB_PASSWORD: &str = "distlock-test";

/// Where Debian installs the newest PostgreSQL's server binaries.
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("postgres").is_file())
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

impl StoreSpec {
    /// A private PostgreSQL server (the newest installed under `/usr/lib/postgresql`), run
    /// as the `postgres` user: `initdb` with superuser `postgres` and password
    /// [`POSTGRES_PASSWORD`] (checked over TCP, sent in clear text on loopback), listening on 127.0.0.1 only, with its unix
    /// socket in the data directory. Writes are fsynced as in production.
    pub fn postgres() -> Self {
        let bin = postgres_bin_dir().unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"));
        let initdb = bin.join("initdb");
        StoreSpec::new(bin.join("postgres"), "postgresql")
            .run_as("postgres")
            .setup(move |data| {
                let pwfile = data.with_file_name("pwfile");
                fs::write(&pwfile, POSTGRES_PASSWORD)?;
                fs::set_permissions(&pwfile, fs::Permissions::from_mode(0o644))?;
                let mut command = Command::new(&initdb);
                command
                    .arg("-D")
                    .arg(data)
                    .args(["-U", "postgres", "-E", "UTF8", "--no-locale"])
                    // `password` (cleartext over loopback) rather than scram: the server still
                    // checks the stored scram hash, but clients skip the PBKDF2 work, which
                    // in unoptimised test builds costs more than the lock calls measured.
                    .args(["--auth-local=trust", "--auth-host=password"])
                    .arg(format!("--pwfile={}", pwfile.display()));
                run_setup_command(command, "postgres")
            })
            .args(|port, data| {
                let data = data.display().to_string();
                [
                    "-D",
                    &data,
                    "-p",
                    &port.to_string(),
                    "-k",
                    &data,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=300",
                ]
                .map(str::to_owned)
                .to_vec()
            })
            .probe(postgres_ready)
    }

    /// A private MariaDB server run as the `mysql` user, root with an empty password over
    /// TCP, plus the database [`MARIADB_DATABASE`] and the user [`MARIADB_USER`] /
    /// [`MARIADB_PASSWORD`] with all privileges on it (created at every start, idempotently).
    pub fn mariadb() -> Self {
        StoreSpec::new("mariadbd", "mariadb-server")
            .run_as("mysql")
            .setup(|data| {
                let init = data.with_file_name("init.sql");
                fs::write(
                    &init,
                    format!(
                        "CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE};\n\
                         CREATE USER IF NOT EXISTS '{MARIADB_USER}'@'%' IDENTIFIED BY '{MARIADB_PASSWORD}';\n\
                         GRANT ALL ON {MARIADB_DATABASE}.* TO '{MARIADB_USER}'@'%';\n"
                    ),
                )?;
                fs::set_permissions(&init, fs::Permissions::from_mode(0o644))?;
                let mut command = Command::new("mariadb-install-db");
                command
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .args(["--user=mysql", "--auth-root-authentication-method=normal"])
                    // Parallel installs must not share /tmp's temporary tables.
                    .env("TMPDIR", data.parent().unwrap_or(data));
                run_setup_command(command, "mysql")
            })
            .args(|port, data| {
                let dir = data.parent().unwrap_or(data).display().to_string();
                vec![
                    "--no-defaults".to_owned(),
                    format!("--datadir={}", data.display()),
                    format!("--socket={dir}/mysqld.sock"),
                    format!("--pid-file={dir}/mysqld.pid"),
                    format!("--init-file={dir}/init.sql"),
                    format!("--tmpdir={dir}"),
                    format!("--port={port}"),
                    "--bind-address=127.0.0.1".to_owned(),
                    "--user=mysql".to_owned(),
                    "--max-connections=500".to_owned(),
                    "--skip-name-resolve".to_owned(),
                ]
            })
            .probe(mariadb_ready)
    }
}

/// PostgreSQL accepts connections while it starts up or recovers and refuses them with an
/// error; an authentication request means it is ready.
async fn postgres_ready(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    let params = b"user\0postgres\0database\0postgres\0\0";
    let mut startup = Vec::new();
    startup.extend_from_slice(&(8 + params.len() as u32).to_be_bytes());
    startup.extend_from_slice(&196_608u32.to_be_bytes());
    startup.extend_from_slice(params);
    stream.write_all(&startup).await?;
    let mut tag = [0u8; 1];
    stream.read_exact(&mut tag).await?;
    match tag[0] {
        b'R' => Ok(()),
        other => Err(io::Error::other(format!(
            "startup answered with message {:?}",
            char::from(other)
        ))),
    }
}

/// MariaDB greets with a protocol-10 handshake once it serves; an error packet
/// (0xff) otherwise.
async fn mariadb_ready(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).await?;
    if header[4] == 10 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "greeting starts with {:#04x}, not a handshake",
            header[4]
        )))
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

/// Why a store process could not be started or controlled.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreProcessError {
    /// The server binary is not installed; the scenario cannot run on this machine.
    BinaryMissing {
        /// The binary that was looked for.
        binary: String,
        /// What to install to get it.
        hint: String,
    },
    /// The server exited before it became ready.
    Exited {
        /// The server binary.
        binary: String,
        /// How it exited.
        status: ExitStatus,
        /// The end of its stdout/stderr log.
        log_tail: String,
    },
    /// The server kept running but did not pass the readiness checks in time; it was killed.
    NotReady {
        /// The server binary.
        binary: String,
        /// The address that was probed.
        addr: SocketAddr,
        /// How long readiness was awaited.
        waited: Duration,
        /// Why the last readiness attempt failed.
        last_error: String,
        /// The end of its stdout/stderr log.
        log_tail: String,
    },
    /// A signal was requested but the server is not running (killed, or failed to restart).
    NotRunning,
    /// An operating-system call failed.
    Io {
        /// What the fixture was doing.
        action: String,
        /// The underlying error.
        source: io::Error,
    },
}

impl fmt::Display for StoreProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BinaryMissing { binary, hint } => {
                write!(f, "store server binary `{binary}` not found: {hint}")
            }
            Self::Exited {
                binary,
                status,
                log_tail,
            } => write!(
                f,
                "`{binary}` exited before it was ready ({status}); end of its log:\n{log_tail}"
            ),
            Self::NotReady {
                binary,
                addr,
                waited,
                last_error,
                log_tail,
            } => write!(
                f,
                "`{binary}` was not ready on {addr} after {waited:?} (last check: {last_error}); \
                 end of its log:\n{log_tail}"
            ),
            Self::NotRunning => f.write_str("the store process is not running"),
            Self::Io { action, source } => write!(f, "{action}: {source}"),
        }
    }
}

impl std::error::Error for StoreProcessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_error(action: impl Into<String>) -> impl FnOnce(io::Error) -> StoreProcessError {
    let action = action.into();
    move |source| StoreProcessError::Io { action, source }
}

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
        read_tail(&self.dir.path().join("server.log"))
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
        let deadline = Instant::now() + Duration::from_secs(10);
        while strays.iter().any(|pid| is_alive(*pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
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
        if signal == libc::SIGCONT {
            signal_each(&descendants(child.id()), signal);
        }
        signal_group(child.id(), signal)
            .map_err(io_error(format!("{action} the store process")))?;
        if signal != libc::SIGCONT {
            // The group leader is stopped first, so it forks no new workers meanwhile.
            signal_each(&descendants(child.id()), signal);
        }
        Ok(())
    }

    async fn launch(&mut self) -> Result<(), StoreProcessError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
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

    async fn wait_ready(&mut self) -> Result<(), StoreProcessError> {
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

impl Drop for StoreProcess {
    fn drop(&mut self) {
        if let Err(error) = self.kill() {
            tracing::warn!(%error, port = self.port, "could not kill the store process");
        }
    }
}

/// The ids to run the spec's server as, when it names a user and we are root.
fn spec_ids(spec: &StoreSpec) -> Result<Option<(u32, u32)>, StoreProcessError> {
    match &spec.run_as {
        Some(user) if is_root() => system_user(user)
            .map(Some)
            .map_err(io_error(format!("look up the system user `{user}`"))),
        _ => Ok(None),
    }
}

fn is_root() -> bool {
    // The owner of /proc/self is the process's effective uid; no unsafe getuid() needed.
    fs::metadata("/proc/self")
        .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0)
        .unwrap_or(false)
}

/// The uid and gid of the system user `name`, from `/etc/passwd`.
pub fn system_user(name: &str) -> io::Result<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&name) && fields.len() > 3)
        .and_then(|fields| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no system user `{name}` (installing the server package creates it)"),
            )
        })
}

/// Runs a setup command to completion as `user` (when root), failing with its output.
fn run_setup_command(mut command: Command, user: &str) -> io::Result<()> {
    if is_root() {
        let (uid, gid) = system_user(user)?;
        command.uid(uid).gid(gid);
    }
    let output = command.stdin(Stdio::null()).output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{command:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

fn missing(spec: &StoreSpec) -> StoreProcessError {
    StoreProcessError::BinaryMissing {
        binary: spec.binary.display().to_string(),
        hint: format!(
            "install the Debian package `{0}` (sudo apt-get install {0})",
            spec.package
        ),
    }
}

/// Looks the binary up before anything else happens, so a missing server is reported as
/// such rather than as a failed setup step. The sbin directories are searched too because
/// some servers (mariadbd) live there and are not in a normal user's `PATH`.
fn resolve_binary(spec: &StoreSpec) -> Result<PathBuf, StoreProcessError> {
    if spec.binary.components().count() > 1 {
        return if spec.binary.is_file() {
            Ok(spec.binary.clone())
        } else {
            Err(missing(spec))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(&spec.binary))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| missing(spec))
}

/// Asks the kernel for a free port. Another process can take it before the server binds;
/// [`StoreProcess::start`] retries for that case.
fn free_port() -> Result<u16, StoreProcessError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map_err(io_error("find a free port"))?;
    Ok(listener.port())
}

#[allow(unsafe_code)]
fn signal_group(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let group = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) only takes integers and touches none of our memory. `group` is the pid
    // of our own child, which leads its own process group (`process_group(0)`) and has not
    // been reaped, so the id cannot have been reused by an unrelated group.
    match unsafe { libc::kill(-group, signal) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Every live descendant of `root`, from `/proc` (empty where there is no `/proc`).
fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name is in parentheses and may contain spaces.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        index += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` still runs (a zombie waiting to be reaped by init does not).
fn is_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Signals each process on its own (those that called `setsid` left our group);
/// one that has exited meanwhile is no error.
fn signal_each(pids: &[u32], signal: libc::c_int) {
    for pid in pids {
        if let Err(error) = signal_process(*pid, signal) {
            tracing::debug!(pid, %error, "could not signal a store worker");
        }
    }
}

#[allow(unsafe_code)]
fn signal_process(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) only takes integers and touches none of our memory. `pid` is a
    // descendant of our unreaped child found a moment ago; signalling a reused pid is the
    // (tiny) risk every process supervisor takes.
    match unsafe { libc::kill(pid, signal) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

fn read_tail(path: &Path) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(tail) if tail.trim().is_empty() => "(the log is empty)".to_owned(),
        Ok(tail) => tail,
        Err(error) => format!("(could not read {}: {error})", path.display()),
    }
}
