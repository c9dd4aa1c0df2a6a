//! Running the real `distlock` binary: a private SQLite store per test, and processes whose
//! output lines and exit are events to wait on, each with a deadline.

#![allow(dead_code)] // Each test binary uses its own subset.

pub mod pty;

use std::io::{BufRead as _, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// How long any one expected event may take on the loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A SQLite store in a temporary directory of its own.
pub struct Store {
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl Store {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Store { dir, url }
    }

    /// `distlock -s URL ARGS...`.
    pub fn distlock(&self, args: &[&str]) -> Command {
        let mut command = bare_distlock();
        command.arg("-s").arg(&self.url).args(args);
        command
    }

    /// `distlock -s URL ARGS...`, run to completion.
    pub fn output(&self, args: &[&str]) -> Finished {
        Finished::of(self.distlock(args))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The binary with no store from the environment (the tests' own must not leak in).
pub fn bare_distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command.env_remove("DISTLOCK_STORE").env_remove("RUST_LOG");
    command
}

/// A process that ran to completion.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Runs `command` (stdin closed), waiting at most [`PATIENCE`].
    pub fn of(command: Command) -> Self {
        let running = Running::spawn(command);
        drop(running.stdin_handle());
        let status = running.exit(PATIENCE);
        Finished {
            code: status.code(),
            stdout: running.rest_of_stdout(),
            stderr: running.rest_of_stderr(),
        }
    }

    /// Asserts the exit code, showing the output if it differs.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// A running process: its output lines and its exit arrive on channels.
pub struct Running {
    pub pid: u32,
    stdin: std::sync::Mutex<Option<ChildStdin>>,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    exit: Receiver<ExitStatus>,
    seen_stderr: std::sync::Mutex<Vec<String>>,
    exited: std::sync::atomic::AtomicBool,
}

impl Running {
    pub fn spawn(mut command: Command) -> Self {
        let mut child: Child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("distlock starts");
        let stdout = lines(child.stdout.take().expect("piped stdout"));
        let stderr = lines(child.stderr.take().expect("piped stderr"));
        let stdin = child.stdin.take();
        let pid = child.id();
        let (exit_tx, exit) = channel();
        std::thread::spawn(move || {
            let status = child.wait().expect("wait for distlock");
            let _ = exit_tx.send(status);
        });
        Running {
            pid,
            stdin: std::sync::Mutex::new(stdin),
            stdout,
            stderr,
            exit,
            seen_stderr: std::sync::Mutex::default(),
            exited: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Takes the process's stdin: dropping it closes the pipe.
    pub fn stdin_handle(&self) -> Option<ChildStdin> {
        self.stdin.lock().expect("stdin").take()
    }

    /// The next line on stdout.
    pub fn line(&self) -> String {
        self.stdout.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!(
                "no stdout line within {PATIENCE:?}; stderr: {}",
                self.rest_of_stderr()
            )
        })
    }

    /// Waits for a stderr line containing `needle`.
    pub fn stderr_line_containing(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.seen_stderr.lock().expect("stderr").push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no stderr line containing {needle:?} within {PATIENCE:?}; saw: {:?}",
                    self.seen_stderr.lock().expect("stderr")
                ),
            }
        }
    }

    /// Waits for the exit.
    pub fn exit(&self, within: Duration) -> ExitStatus {
        let status = self.exit.recv_timeout(within);
        self.exited
            .store(status.is_ok(), std::sync::atomic::Ordering::Relaxed);
        status.unwrap_or_else(|_| {
            panic!("distlock (pid {}) did not exit within {within:?}", self.pid)
        })
    }

    /// Waits for the exit and returns the code (panics on a signal death).
    pub fn exit_code(&self) -> i32 {
        let status = self.exit(PATIENCE);
        status.code().unwrap_or_else(|| {
            panic!(
                "distlock died of {status}; stderr: {}",
                self.rest_of_stderr()
            )
        })
    }

    /// Sends `signal` (a name for kill(1), e.g. `STOP`) to distlock itself.
    pub fn signal(&self, signal: &str) {
        send_signal(self.pid, signal);
    }

    /// All of stdout still to come (after the exit).
    pub fn rest_of_stdout(&self) -> String {
        drain(&self.stdout)
    }

    /// All of stderr seen and still to come (after the exit).
    pub fn rest_of_stderr(&self) -> String {
        let seen: String = self
            .seen_stderr
            .lock()
            .expect("stderr")
            .iter()
            .map(|line| format!("{line}\n"))
            .collect();
        seen + &drain(&self.stderr)
    }
}

impl Drop for Running {
    /// A test that failed half-way leaves no distlock behind.
    fn drop(&mut self) {
        // Not seen to exit and nothing sent: the waiting thread still waits (it has not
        // reaped the process), so the pid is still ours.
        let exited = self.exited.load(std::sync::atomic::Ordering::Relaxed);
        if !exited && matches!(self.exit.try_recv(), Err(TryRecvError::Empty)) {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
    }
}

/// `command` in a process group of its own, as a shell with job control starts a job (so
/// that a signal to the job does not reach the test).
pub fn as_job(mut command: Command) -> Command {
    use std::os::unix::process::CommandExt as _;
    command.process_group(0);
    command
}

impl Running {
    /// Sends `signal` to distlock's process group, as a shell's `kill %1` or the terminal
    /// (for Ctrl-Z) would: the process must have been started [`as_job`].
    pub fn signal_job(&self, signal: &str) {
        send_signal_to_group(self.pid, signal);
    }
}

/// Sends `signal` to the process group `group` through kill(1).
pub fn send_signal_to_group(group: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{group}"))
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -{signal} -- -{group} failed");
}

/// The one child of `pid` (distlock's command), waiting for it to be started.
pub fn child_of(pid: u32) -> u32 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let children: Vec<u32> = std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&candidate| stat_field(candidate, 1).as_deref() == Some(&pid.to_string()))
            .collect();
        match children[..] {
            [child] => return child,
            [] => assert!(Instant::now() < deadline, "pid {pid} has no child"),
            _ => panic!("pid {pid} has several children: {children:?}"),
        }
        // Polling /proc: no event says that another process forked.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state letter of `pid` ("T" stopped, "S" sleeping, "R" running, "Z" zombie).
pub fn state_of(pid: u32) -> Option<String> {
    stat_field(pid, 0)
}

/// Waits (with a deadline) until `pid` is stopped.
pub fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    while state_of(pid).as_deref() != Some("T") {
        assert!(
            Instant::now() < deadline,
            "pid {pid} not stopped after {PATIENCE:?} (state {:?})",
            state_of(pid)
        );
        // Polling /proc: a stop of another parent's child has no event we can wait on.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Field `index` after the command name of /proc/PID/stat (0 is the state, 1 the parent).
fn stat_field(pid: u32, index: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(index).map(str::to_string)
}

/// Sends `signal` to `pid` through kill(1).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Whether `pid` is a live process (a zombie, dead but not yet reaped by init, is not).
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Waits (with a deadline) for `pid` to be gone: the group kill is asynchronous.
pub fn wait_gone(pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    while is_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "pid {pid} still alive after {PATIENCE:?}"
        );
        // Polling /proc: a process of another parent's has no exit event we can wait on.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A file with no execute permission.
pub fn not_executable(dir: &Path) -> PathBuf {
    let path = dir.join("not-executable.sh");
    std::fs::write(&path, "#!/bin/sh\nexit 0\n").expect("write script");
    path
}

fn lines(stream: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn drain(lines: &Receiver<String>) -> String {
    // After the exit the writer thread ends at end of file; wait for it with the deadline.
    let mut out = String::new();
    while let Ok(line) = lines.recv_timeout(PATIENCE) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A `distlock run` that holds `key` until its stdin is closed, after printing
/// `held TOKEN`.
pub fn holder(store: &Store, key: &str, extra: &[&str]) -> (Running, u64) {
    holder_of(store, "run", key, extra)
}

/// [`holder`] through `subcommand` (`run`, or `elect`, whose token is the term).
pub fn holder_of(store: &Store, subcommand: &str, key: &str, extra: &[&str]) -> (Running, u64) {
    let mut args = vec![subcommand];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        key,
        "-c",
        "echo \"held $DISTLOCK_TOKEN\"; read _; echo released",
    ]);
    let running = Running::spawn(store.distlock(&args));
    let line = running.line();
    let token = line
        .strip_prefix("held ")
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (running, token)
}

/// Lets a [`holder`] go and checks it released cleanly.
pub fn let_go(holder: Running) {
    drop(holder.stdin_handle());
    assert_eq!(holder.line(), "released");
    assert_eq!(holder.exit_code(), 0, "{}", holder.rest_of_stderr());
}
