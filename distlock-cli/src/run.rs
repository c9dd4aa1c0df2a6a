//! `distlock run`: acquire, run the command, release when it exits, whatever happens.

use std::time::Duration;

use distlock::{ErrorKind, LockGuard, Wait};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use crate::child::{exit_code, stop_self, Event, Group, Program};
use crate::cli::{ElectArgs, OnLost, RunArgs};
use crate::failure::{describe, killed_by, Failure, LOST, UNAVAILABLE, USAGE};
use crate::store;

/// Runs `args`' command under the lock on `store_url`; the result is the exit code.
pub async fn run(args: RunArgs, store_url: &str) -> Result<u8, Failure> {
    // Installed before anything else, so a signal during the wait is ours to handle (and
    // ends the wait cleanly) rather than killing distlock with nothing released.
    let mut signals = Signals::new()?;
    let guard = until_interrupted(&mut signals, &args.key, acquire(&args, store_url)).await?;
    let env = [
        ("DISTLOCK_KEY", args.key.clone()),
        ("DISTLOCK_TOKEN", guard.token().to_string()),
        ("DISTLOCK_LEASE_ID", guard.lease().id().to_string()),
    ];
    let supervised = run_command(&guard, &args, &env, &mut signals).await;
    let released = guard.release().await;
    conclude(&args.key, store_url, supervised, released)
}

/// Runs `args`' command while leading the election `args.run.key` on `store_url` (with
/// `--retry`, campaigning again after a loss); the result is the exit code.
pub async fn elect(args: ElectArgs, store_url: &str) -> Result<u8, Failure> {
    let run = &args.run;
    if run.permits.is_some() || run.shared || run.exclusive {
        return Err(Failure::new(
            USAGE,
            "elect campaigns for the election NAME: --permits, --shared and --exclusive do not apply",
        ));
    }
    let mut signals = Signals::new()?;
    let client = store::connect(store_url).await?;
    let label = run.label.clone().unwrap_or_else(default_label);
    let value = args.value.clone().unwrap_or_else(|| label.clone());
    loop {
        let campaign = || {
            client
                .elect(&run.key)
                .value(value.as_bytes())
                .ttl(run.ttl)
                .holder_label(&label)
        };
        let campaign = async {
            let elected = match campaign().no_wait().await {
                Err(err) if err.kind() == ErrorKind::HeldByAnother && !run.no_wait => {
                    tracing::info!(name = %run.key, "waiting to be elected: another candidate leads");
                    campaign()
                        .wait(run.wait.map_or(Wait::Forever, Wait::UpTo))
                        .await
                }
                other => other,
            };
            elected.map_err(|err| not_acquired(&err, run, store_url))
        };
        let leadership = until_interrupted(&mut signals, &run.key, campaign).await?;
        tracing::info!(name = %run.key, term = %leadership.term(), "elected");
        let env = [
            ("DISTLOCK_KEY", run.key.clone()),
            ("DISTLOCK_TERM", leadership.term().to_string()),
            ("DISTLOCK_TOKEN", leadership.term().to_string()),
            (
                "DISTLOCK_LEASE_ID",
                leadership.guard().lease().id().to_string(),
            ),
        ];
        let supervised = run_command(leadership.guard(), run, &env, &mut signals).await;
        let resigned = leadership.resign().await;
        let concluded = conclude(&run.key, store_url, supervised, resigned);
        match concluded {
            Err(failure) if failure.code == LOST && args.retry => {
                eprintln!("distlock: {failure}; campaigning again (--retry)");
            }
            other => return other,
        }
    }
}

/// Awaits `acquiring` unless a signal ends the wait first: Ctrl-Z suspends distlock like
/// any job (the wait goes on after), the interrupts end it with 128+N.
async fn until_interrupted<T>(
    signals: &mut Signals,
    key: &str,
    acquiring: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let mut acquiring = std::pin::pin!(acquiring);
    loop {
        tokio::select! {
            acquired = &mut acquiring => return acquired,
            signal = signals.recv() => match signal {
                // Ctrl-Z while waiting: suspended like any job; the wait goes on after.
                libc::SIGTSTP => stop_self(libc::SIGTSTP, false),
                libc::SIGCONT => {}
                _ => {
                    // Dropping the acquisition releases whatever it may have been granted,
                    // in the background; `main` waits for that before exiting.
                    return Err(Failure::new(
                        killed_by(signal),
                        format!("interrupted by signal {signal} while waiting for {key:?}"),
                    ));
                }
            }
        }
    }
}

/// Starts the command with `env` and supervises it under `guard`.
async fn run_command(
    guard: &LockGuard,
    args: &RunArgs,
    env: &[(&str, String)],
    signals: &mut Signals,
) -> Result<Supervised, Failure> {
    let program = match &args.shell {
        Some(script) => Program::Shell(script),
        None => Program::Argv(&args.command),
    };
    match Group::spawn(&program, env) {
        Ok(group) => supervise(group, guard, args, signals).await,
        Err(failure) => Err(failure),
    }
}

/// The exit code of a run: the command's, or why the lock failed it.
fn conclude(
    key: &str,
    store_url: &str,
    supervised: Result<Supervised, Failure>,
    released: distlock::Result<()>,
) -> Result<u8, Failure> {
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
    let request = || {
        let request = match (args.permits, args.shared, args.exclusive) {
            (Some(permits), _, _) => client.semaphore(&args.key, permits),
            (None, true, _) => client.read_lock(&args.key),
            (None, false, true) => client.write_lock(&args.key),
            (None, false, false) => client.lock(&args.key),
        };
        request.ttl(args.ttl).holder_label(&label)
    };
    let first = request().no_wait().await;
    let acquired = match first {
        Err(err) if err.kind() == ErrorKind::HeldByAnother && !args.no_wait => {
            tracing::info!(key = %args.key, "waiting for the lock: it is held by another holder");
            let wait = args.wait.map_or(Wait::Forever, Wait::UpTo);
            request().wait(wait).await
        }
        other => other,
    };
    acquired.map_err(|err| not_acquired(&err, args, store_url))
}

/// A failed acquisition as a failure: "not acquired" (the `-E` exit code) while the key is
/// held, otherwise the store's error.
fn not_acquired(err: &distlock::Error, args: &RunArgs, store_url: &str) -> Failure {
    match err.kind() {
        ErrorKind::HeldByAnother | ErrorKind::TimedOut => Failure::new(
            args.conflict_exit_code,
            format!("not acquired: {}", describe(err, store_url)),
        ),
        _ => Failure::from_store_error(err, store_url),
    }
}

/// How the command ended.
enum Supervised {
    /// It exited (or was killed by a signal) with the lock held throughout: distlock's
    /// exit code.
    Exited(u8),
    /// The lock was lost while it ran.
    Lost,
}

/// How often to look again for the members of the command's group that outlive it (they
/// are not distlock's children, so no event says when the last is gone): from the first
/// pause, doubling up to the last.
const LEFTOVERS_POLL: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(200));

/// What `supervise` knows about the lock and the stop it sent.
struct Watch<'a> {
    group: Group,
    guard: &'a LockGuard,
    args: &'a RunArgs,
    lost_seen: bool,
    kill_at: Option<Instant>,
}

/// Waits for the command and every process of its group, forwarding signals, suspending
/// with it like a shell job, and stops it if the lock is lost.
async fn supervise(
    group: Group,
    guard: &LockGuard,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<Supervised, Failure> {
    let mut lost = std::pin::pin!(guard.lost());
    let mut watch = Watch {
        group,
        guard,
        args,
        lost_seen: false,
        kill_at: None,
    };
    let mut status = None;
    // An interrupt (INT, TERM, HUP, QUIT) was forwarded: the job is to end, and what the
    // command leaves behind is stopped rather than waited for (a shell starts `cmd &`
    // with SIGINT and SIGQUIT ignored, so forwarding alone would not end the wait).
    let mut interrupted = false;
    let mut poll = LEFTOVERS_POLL.0;
    let status = loop {
        // The lock covers every process the command started in its group, not only the
        // command: a background job of a shell script must not run on unprotected.
        if let Some(status) = status {
            if !watch.group.has_live_members() {
                break status;
            }
        }
        tokio::select! {
            event = watch.group.next_event() => {
                let event = event.map_err(|err| {
                    Failure::new(UNAVAILABLE, format!("waiting for the command: {err}"))
                })?;
                match event {
                    Event::Exited(leader) => {
                        status = Some(leader);
                        let _ = watch.group.reclaim_terminal();
                        if (args.kill_group_on_exit || interrupted)
                            && !watch.lost_seen
                            && watch.kill_at.is_none()
                        {
                            watch.stop_leftovers();
                        }
                    }
                    // Ctrl-Z on the terminal the command has.
                    Event::Stopped(libc::SIGTSTP) => watch.suspend(libc::SIGTSTP, true),
                    // The command read the terminal (or wrote, with `tostop`) from the
                    // background.
                    Event::Stopped(signal @ (libc::SIGTTIN | libc::SIGTTOU)) => {
                        // distlock itself is in the foreground now (`fg` of a job started
                        // with `&`): the command's turn at the terminal. Otherwise the
                        // whole job waits for `fg`, as a shell's background job does.
                        if watch.group.hand_terminal() {
                            let _ = watch.group.signal(libc::SIGCONT);
                        } else {
                            // A shell says "Stopped (tty input)" of its own jobs; of
                            // distlock it cannot tell why.
                            eprintln!(
                                "distlock: the command stopped to use the terminal from the background; \
                                 distlock stops with it until `fg` (meanwhile the lock on {:?} lapses after its TTL)",
                                args.key
                            );
                            watch.suspend(signal, false);
                        }
                    }
                    // A SIGSTOP from elsewhere (a debugger, an operator): the command
                    // still holds the lock, paused; continued, it goes on under it.
                    Event::Stopped(_) | Event::Continued => {}
                }
            }
            signal = signals.recv() => match signal {
                libc::SIGTSTP => watch.suspend(libc::SIGTSTP, false),
                libc::SIGCONT => {
                    // Continued by `fg` after a `&`: the terminal goes to the command.
                    watch.group.hand_terminal();
                }
                other => {
                    // The group may just have exited (ESRCH): nothing left to forward to.
                    let _ = watch.group.signal(other);
                    interrupted = true;
                    if status.is_some() && !watch.lost_seen && watch.kill_at.is_none() {
                        watch.stop_leftovers();
                    }
                }
            },
            _ = &mut lost, if !watch.lost_seen => watch.on_lost(),
            () = sleep_until(watch.kill_at), if watch.kill_at.is_some() => {
                watch.kill_at = None;
                let _ = watch.group.signal(libc::SIGKILL);
            }
            () = tokio::time::sleep(poll), if status.is_some() => {
                poll = (poll * 2).min(LEFTOVERS_POLL.1);
            }
        }
    };
    if watch.lost_seen {
        return Ok(Supervised::Lost);
    }
    Ok(Supervised::Exited(exit_code(status)))
}

impl Watch<'_> {
    /// Suspends the command's group and then distlock, as Ctrl-Z suspends a shell job:
    /// while distlock is stopped it renews nothing, so the command must not run either.
    /// Returns once distlock is continued (`fg`, `bg`, SIGCONT), having continued the
    /// command too, unless the lock was lost meanwhile: then the command gets `--on-lost`
    /// first (with SIGTERM pending, it runs no more of its own code when continued).
    ///
    /// distlock stops by `signal`, the stop the command got (or distlock's own SIGTSTP);
    /// `as_terminal` is for a Ctrl-Z the command got because distlock had handed it the
    /// terminal: then distlock's whole group stops, as the terminal would have stopped it.
    fn suspend(&mut self, signal: libc::c_int, as_terminal: bool) {
        let _ = self.group.signal(libc::SIGSTOP);
        let had_terminal = self.group.reclaim_terminal();
        stop_self(signal, as_terminal && had_terminal);
        // Continued.
        if !self.lost_seen && !self.guard.is_held() {
            self.on_lost();
        }
        self.group.hand_terminal();
        let _ = self.group.signal(libc::SIGCONT);
    }

    /// Acts on a lost lock as `--on-lost` says.
    fn on_lost(&mut self) {
        self.lost_seen = true;
        self.kill_at = on_lost(&self.group, self.guard, self.args);
    }

    /// `--kill-group-on-exit`: the command has exited; what it left in its group gets
    /// SIGTERM now and SIGKILL after `--kill-after`.
    fn stop_leftovers(&mut self) {
        if self.group.signal(libc::SIGTERM).is_ok() {
            // A stopped member acts on SIGTERM only once continued.
            let _ = self.group.signal(libc::SIGCONT);
            self.kill_at = Some(Instant::now() + self.args.kill_after);
        }
    }
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
            // A stopped member acts on SIGTERM only once continued (as a shell's `kill`
            // of a stopped job does).
            let _ = group.signal(libc::SIGCONT);
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

/// The signals distlock forwards to the command (and that end a wait for the lock), and
/// those of job control.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
    suspend: Signal,
    resumed: Signal,
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
            quit: install(SignalKind::quit())?,
            suspend: install(SignalKind::from_raw(libc::SIGTSTP))?,
            resumed: install(SignalKind::from_raw(libc::SIGCONT))?,
        })
    }

    /// The next signal received, by number.
    async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
            _ = self.suspend.recv() => libc::SIGTSTP,
            _ = self.resumed.recv() => libc::SIGCONT,
        }
    }
}
