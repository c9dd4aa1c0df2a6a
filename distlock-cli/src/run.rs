//! `distlock run`: acquire, run the command, release when it exits, whatever happens.

use std::time::Duration;

use distlock::{ErrorKind, LockGuard, Wait};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use crate::child::{exit_code, Group, Program};
use crate::cli::{OnLost, RunArgs};
use crate::failure::{describe, killed_by, Failure, LOST, UNAVAILABLE};
use crate::store;

/// Runs `args`' command under the lock on `store_url`; the result is the exit code.
pub async fn run(args: RunArgs, store_url: &str) -> Result<u8, Failure> {
    // Installed before anything else, so a signal during the wait is ours to handle (and
    // ends the wait cleanly) rather than killing distlock with nothing released.
    let mut signals = Signals::new()?;
    let guard = tokio::select! {
        acquired = acquire(&args, store_url) => acquired?,
        signal = signals.recv() => {
            return Err(Failure::new(
                killed_by(signal),
                format!("interrupted by signal {signal} while waiting for {:?}", args.key),
            ));
        }
    };
    let program = match &args.shell {
        Some(script) => Program::Shell(script),
        None => Program::Argv(&args.command),
    };
    let env = [
        ("DISTLOCK_KEY", args.key.clone()),
        ("DISTLOCK_TOKEN", guard.token().to_string()),
        ("DISTLOCK_LEASE_ID", guard.lease().id().to_string()),
    ];
    let supervised = match Group::spawn(&program, &env) {
        Ok(group) => supervise(group, &guard, &args, &mut signals).await,
        Err(failure) => Err(failure),
    };
    let key = args.key.as_str();
    let released = guard.release().await;
    match (supervised, released) {
        (Ok(Supervised::Lost), _) => Err(Failure::new(
            LOST,
            format!("the lock on {key:?} was lost while the command ran; the command was not protected after that"),
        )),
        // The command never started: whatever the release says, that is the news.
        (Err(failure), _) => Err(failure),
        (_, Err(err)) if err.kind() == ErrorKind::Lost => Err(Failure::new(
            LOST,
            format!("the lock on {key:?} was lost before the command finished: {}", describe(&err, store_url)),
        )),
        (Ok(Supervised::Exited(code)), Err(err)) => {
            // The lease was held as far as we know (no loss was signalled); the store will
            // expire it by its TTL. The command's status still tells how it went.
            eprintln!("distlock: warning: releasing {key:?}: {}", describe(&err, store_url));
            Ok(code)
        }
        (Ok(Supervised::Exited(code)), Ok(())) => Ok(code),
    }
}

/// Connects and takes the lock as `args` ask; "not acquired" is the `-E` exit code. (The
/// guard keeps what it needs of the client alive.)
async fn acquire(args: &RunArgs, store_url: &str) -> Result<LockGuard, Failure> {
    let client = store::connect(store_url).await?;
    let label = args.label.clone().unwrap_or_else(default_label);
    let request = || client.lock(&args.key).ttl(args.ttl).holder_label(&label);
    let first = request().no_wait().await;
    let acquired = match first {
        Err(err) if err.kind() == ErrorKind::HeldByAnother && !args.no_wait => {
            tracing::info!(key = %args.key, "waiting for the lock: it is held by another holder");
            let wait = args.wait.map_or(Wait::Forever, Wait::UpTo);
            request().wait(wait).await
        }
        other => other,
    };
    acquired.map_err(|err| match err.kind() {
        ErrorKind::HeldByAnother | ErrorKind::TimedOut => Failure::new(
            args.conflict_exit_code,
            format!("not acquired: {}", describe(&err, store_url)),
        ),
        _ => Failure::from_store_error(&err, store_url),
    })
}

/// How the command ended.
enum Supervised {
    /// It exited (or was killed by a signal) with the lock held throughout: distlock's
    /// exit code.
    Exited(u8),
    /// The lock was lost while it ran.
    Lost,
}

/// Waits for the command, forwarding signals, and stops it if the lock is lost.
async fn supervise(
    mut group: Group,
    guard: &LockGuard,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<Supervised, Failure> {
    let mut lost = std::pin::pin!(guard.lost());
    let mut lost_seen = false;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = group.wait() => break status,
            signal = signals.recv() => {
                // The group may just have exited (ESRCH): nothing left to forward to.
                let _ = group.signal(signal);
            }
            () = &mut lost, if !lost_seen => {
                lost_seen = true;
                kill_at = on_lost(&group, guard, args);
            }
            () = sleep_until(kill_at), if kill_at.is_some() => {
                kill_at = None;
                let _ = group.signal(libc::SIGKILL);
            }
        }
    };
    let status = status
        .map_err(|err| Failure::new(UNAVAILABLE, format!("waiting for the command: {err}")))?;
    if !lost_seen {
        return Ok(Supervised::Exited(exit_code(status)));
    }
    // The leader is gone; whatever else of the group ignored SIGTERM (a grandchild that
    // traps it) gets SIGKILL at the end of the same grace period.
    if let Some(deadline) = kill_at {
        // Polled: the other members are not our children, so no event tells when the
        // last of them is gone.
        while group.has_live_members() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50).min(deadline - Instant::now())).await;
        }
        if group.has_live_members() {
            let _ = group.signal(libc::SIGKILL);
        }
    }
    Ok(Supervised::Lost)
}

/// Acts on a lost lock as `--on-lost` says; the instant to send SIGKILL, if any.
fn on_lost(group: &Group, guard: &LockGuard, args: &RunArgs) -> Option<Instant> {
    let what = format!(
        "lost the lock on {:?} (token {}) while the command ran",
        args.key,
        guard.token()
    );
    match args.on_lost {
        OnLost::Term => {
            eprintln!("distlock: {what}: sending SIGTERM to the command's process group (SIGKILL in {:?})", args.kill_after);
            let _ = group.signal(libc::SIGTERM);
            Some(Instant::now() + args.kill_after)
        }
        OnLost::Kill => {
            eprintln!("distlock: {what}: sending SIGKILL to the command's process group");
            let _ = group.signal(libc::SIGKILL);
            None
        }
        OnLost::Ignore => {
            eprintln!("distlock: warning: {what}; letting it finish (--on-lost ignore)");
            None
        }
    }
}

/// Sleeps until `at`; never resolves for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// "distlock run, pid N on HOST": who holds the lock, for `distlock status`.
fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|name| name.trim().to_string())
        .unwrap_or_default();
    let pid = std::process::id();
    if host.is_empty() {
        format!("distlock run, pid {pid}")
    } else {
        format!("distlock run, pid {pid} on {host}")
    }
}

/// The signals distlock forwards to the command (and that end a wait for the lock).
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let install = |kind: SignalKind| {
            signal(kind).map_err(|err| {
                Failure::new(UNAVAILABLE, format!("installing a signal handler: {err}"))
            })
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            hangup: install(SignalKind::hangup())?,
        })
    }

    /// The next signal received, by number.
    async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
        }
    }
}
