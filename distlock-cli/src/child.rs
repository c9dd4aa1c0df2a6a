//! The command run under the lock: started in a process group of its own, so that a
//! signal reaches everything it started (a shell's children too), given the terminal while
//! distlock has it (as a shell gives it to its foreground job), watched for stops as well
//! as its exit, and its exit status turned into distlock's.

use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::ExitStatus;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::failure::{killed_by, Failure, CANNOT_EXECUTE, NOT_FOUND, UNAVAILABLE};

/// What to run: an argument vector, or a string for `sh -c`.
pub enum Program<'a> {
    /// `COMMAND [ARGS...]`.
    Argv(&'a [String]),
    /// `-c 'shell string'`.
    Shell(&'a str),
}

/// What happened to the group's leader (the command), as waitpid(2) reports it.
pub enum Event {
    /// It exited, or was killed by a signal.
    Exited(ExitStatus),
    /// It was stopped by this signal.
    Stopped(libc::c_int),
    /// It was continued after a stop.
    Continued,
}

/// A started command, leading its own process group.
pub struct Group {
    /// The group id: the leader's pid.
    id: libc::pid_t,
    /// Whether the leader was reaped: from then on its pid may name another process, and
    /// only the group (kept alive by its other members) is still ours to signal.
    reaped: bool,
    /// Raised whenever a child of ours changes state: the cue to ask waitpid(2).
    child_signals: Signal,
    /// Standard input when it is a terminal: the terminal distlock shares with the command.
    terminal: Option<libc::c_int>,
}

impl Group {
    /// Starts `program` with `env` added, as the leader of a new process group; if distlock
    /// is in the foreground of the terminal on its standard input, the command is put there
    /// instead, so that it can read the terminal and gets its Ctrl-C, Ctrl-Z and Ctrl-\.
    pub fn spawn(program: &Program<'_>, env: &[(&str, String)]) -> Result<Group, Failure> {
        // Before the spawn, so that not even an immediate exit or stop goes unnoticed.
        let child_signals = signal(SignalKind::child()).map_err(|err| {
            Failure::new(UNAVAILABLE, format!("installing a signal handler: {err}"))
        })?;
        let (mut command, shown) = match program {
            Program::Argv(argv) => {
                let (first, rest) = argv
                    .split_first()
                    .ok_or_else(|| Failure::new(crate::failure::USAGE, "no command given"))?;
                let mut command = std::process::Command::new(first);
                command.args(rest);
                (command, first.clone())
            }
            Program::Shell(script) => {
                let mut command = std::process::Command::new("sh");
                command.arg("-c").arg(script);
                (command, "sh".to_string())
            }
        };
        command.process_group(0);
        command.envs(env.iter().map(|(name, value)| (name, value)));
        let terminal = sys::is_terminal(libc::STDIN_FILENO).then_some(libc::STDIN_FILENO);
        if let Some(fd) = terminal {
            if sys::foreground_group(fd) == Some(sys::own_group()) {
                // Done in the child, before it runs anything: handed over by us after the
                // spawn, the command could already have read the terminal and been stopped.
                sys::take_terminal_before_exec(&mut command, fd);
            }
        }
        // A std child, not a tokio one: tokio's wait does not report stops, and reaping is
        // ours to do (with WUNTRACED) in `next_event`. Dropping the handle does not wait.
        let child = command.spawn().map_err(|err| {
            let code = match err.kind() {
                io::ErrorKind::NotFound => NOT_FOUND,
                _ => CANNOT_EXECUTE,
            };
            Failure::new(code, format!("cannot run {shown:?}: {err}"))
        })?;
        let id = libc::pid_t::try_from(child.id()).map_err(|_| {
            Failure::new(CANNOT_EXECUTE, "the command's process id is out of range")
        })?;
        // From now on distlock may be in the background of its terminal while it takes the
        // terminal back or writes a warning; with `stty tostop` the write would stop it,
        // and a stopped distlock stops renewing while the command runs on. (After the
        // spawn: an ignored signal would be inherited by the command.)
        sys::ignore_terminal_output_stops();
        Ok(Group {
            id,
            reaped: false,
            child_signals,
            terminal,
        })
    }

    /// The next change of the leader: exit, stop or continue. Cancel-safe. Never resolves
    /// once the leader has exited.
    pub async fn next_event(&mut self) -> io::Result<Event> {
        if self.reaped {
            return std::future::pending().await;
        }
        loop {
            if let Some(event) = sys::wait_for_change(self.id)? {
                if matches!(event, Event::Exited(_)) {
                    self.reaped = true;
                }
                return Ok(event);
            }
            if self.child_signals.recv().await.is_none() {
                return Err(io::Error::other("SIGCHLD is no longer delivered"));
            }
        }
    }

    /// Sends `signal` to every process of the group.
    ///
    /// Used while the leader has not been reaped, or while some other member keeps the
    /// group alive: in both cases the id cannot have been reused, because the kernel does
    /// not hand out a pid still in use as a process group id. If the group is empty the
    /// call fails with `ESRCH` and changes nothing.
    pub fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        sys::kill(-self.id, signal)
    }

    /// Whether any process of the group is still alive. Zombies do not count: an orphan
    /// is reaped by init, and some inits (in containers) take their time or never do.
    pub fn has_live_members(&self) -> bool {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            // No /proc: signal 0 checks for existence (zombies included), delivers nothing.
            return self.signal(0).is_ok();
        };
        entries.filter_map(Result::ok).any(|entry| {
            Stat::read(&entry.path()).is_some_and(|stat| stat.group == self.id && stat.state != "Z")
        })
    }

    /// Takes the terminal back for distlock's own group if the command's group has it
    /// (before distlock stops, and once the command has exited). Whether it had it.
    pub fn reclaim_terminal(&self) -> bool {
        let Some(fd) = self.terminal else {
            return false;
        };
        sys::foreground_group(fd) == Some(self.id)
            && sys::set_foreground_group(fd, sys::own_group()).is_ok()
    }

    /// Gives the terminal to the command's group if distlock's group is in the terminal's
    /// foreground (as after `fg`; not after `bg`, where it belongs to the shell) and the
    /// command still runs. Whether it was handed over now.
    pub fn hand_terminal(&self) -> bool {
        let Some(fd) = self.terminal else {
            return false;
        };
        !self.reaped
            && sys::foreground_group(fd) == Some(sys::own_group())
            && sys::set_foreground_group(fd, self.id).is_ok()
    }
}

/// The fields of /proc/PID/stat that job control needs.
struct Stat {
    state: String,
    parent: libc::pid_t,
    group: libc::pid_t,
    session: libc::pid_t,
}

impl Stat {
    /// Reads `dir`/stat (`dir` is /proc/PID); `None` for a process gone meanwhile.
    fn read(dir: &std::path::Path) -> Option<Stat> {
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        // `pid (comm) state ppid pgrp session ...`; comm may contain spaces and ")".
        let after = &stat[stat.rfind(')')? + 1..];
        let mut fields = after.split_whitespace();
        let state = fields.next()?.to_string();
        let mut number = || fields.next()?.parse::<libc::pid_t>().ok();
        Some(Stat {
            state,
            parent: number()?,
            group: number()?,
            session: number()?,
        })
    }
}

/// Whether distlock's process group is watched from outside it: some member has a parent
/// in another group of the same session (a shell, for its job). Otherwise the group is
/// orphaned, and the kernel discards SIGTSTP, SIGTTIN and SIGTTOU sent to it.
fn own_group_is_watched() -> bool {
    let own = sys::own_group();
    let Some(session) = Stat::read(std::path::Path::new("/proc/self")).map(|stat| stat.session)
    else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        let Some(member) = Stat::read(&entry.path()).filter(|stat| stat.group == own) else {
            return false;
        };
        Stat::read(&std::path::Path::new("/proc").join(member.parent.to_string()))
            .is_some_and(|parent| parent.group != own && parent.session == session)
    })
}

/// Stops distlock by `signal` (SIGTSTP, SIGTTIN or SIGTTOU) as if it had no handler for
/// it, so that what waits for distlock (a shell, an outer `distlock run`) sees the
/// job-control stop it would have seen without distlock in between. With `whole_group`,
/// every process of distlock's own group stops, as the terminal stops the foreground group
/// for Ctrl-Z (a shell script that runs distlock, say, whose parent then sees it stopped).
/// Returns once something continues distlock (`fg`, `bg`, SIGCONT).
///
/// A group that no process outside it (in the same session) watches, as a shell watches
/// its jobs, is orphaned: the kernel discards these three signals for it, and distlock
/// stops by SIGSTOP, which nothing discards.
pub fn stop_self(signal: libc::c_int, whole_group: bool) {
    if !own_group_is_watched() {
        // kill(2) on ourselves delivers the signal before it returns, so the whole
        // process is stopped by then; the call returns after the SIGCONT.
        let _ = sys::kill(sys::own_pid(), libc::SIGSTOP);
        return;
    }
    let target = if whole_group {
        -sys::own_group()
    } else {
        sys::own_pid()
    };
    sys::with_default_action(signal, || {
        let _ = sys::kill(target, signal);
    });
}

/// distlock's exit code for the command's exit status: its own code, or 128+N when it was
/// killed by signal N.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(signal)) => killed_by(signal),
        (None, None) => u8::MAX,
    }
}

/// The system calls of job control. All the crate's unsafe code is here: each call takes
/// plain integers (or a pointer to a local) and touches no other memory of ours.
#[allow(unsafe_code)]
mod sys {
    use std::io;
    use std::os::unix::process::CommandExt as _;

    use super::Event;
    use std::os::unix::process::ExitStatusExt as _;

    fn check(result: libc::c_int) -> io::Result<()> {
        match result {
            -1 => Err(io::Error::last_os_error()),
            _ => Ok(()),
        }
    }

    /// kill(2): a negative pid addresses a process group.
    pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
        // SAFETY: integers only.
        check(unsafe { libc::kill(pid, signal) })
    }

    pub fn own_pid() -> libc::pid_t {
        // SAFETY: no arguments; cannot fail.
        unsafe { libc::getpid() }
    }

    /// Runs `body` with `signal` set to its default action, then puts back the action it
    /// had (tokio's handler, or SIG_IGN). The signal's own handler thus does not see the
    /// stop `body` sends, which would otherwise come back as one more Ctrl-Z.
    pub fn with_default_action(signal: libc::c_int, body: impl FnOnce()) {
        // SAFETY: sigaction(2) with local structs; the action put back is exactly the one
        // read, so tokio's registration is left as it found it.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut default.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, &default, &mut previous) == -1 {
                return;
            }
            body();
            libc::sigaction(signal, &previous, std::ptr::null_mut());
        }
    }

    pub fn own_group() -> libc::pid_t {
        // SAFETY: no arguments; cannot fail.
        unsafe { libc::getpgrp() }
    }

    pub fn is_terminal(fd: libc::c_int) -> bool {
        // SAFETY: integers only; a closed fd is answered with 0.
        unsafe { libc::isatty(fd) == 1 }
    }

    /// The terminal's foreground process group, if it has one we can see.
    pub fn foreground_group(fd: libc::c_int) -> Option<libc::pid_t> {
        // SAFETY: integers only.
        let group = unsafe { libc::tcgetpgrp(fd) };
        (group > 0).then_some(group)
    }

    /// tcsetpgrp(3). From a background group it succeeds only because SIGTTOU is ignored
    /// (see `ignore_terminal_output_stops`); otherwise it would stop distlock.
    pub fn set_foreground_group(fd: libc::c_int, group: libc::pid_t) -> io::Result<()> {
        // SAFETY: integers only.
        check(unsafe { libc::tcsetpgrp(fd, group) })
    }

    pub fn ignore_terminal_output_stops() {
        // SAFETY: SIG_IGN installs no code of ours; nothing else in distlock handles
        // SIGTTOU.
        unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
    }

    /// Makes the command, between fork and exec, the leader of its own group and the
    /// terminal's foreground group, as a shell's child does before it execs a job.
    pub fn take_terminal_before_exec(command: &mut std::process::Command, fd: libc::c_int) {
        let hook = move || {
            // SAFETY (every call below): async-signal-safe calls on integers and on the
            // local signal sets, as pre_exec requires after a fork.
            unsafe {
                // Also asked of std with process_group(0); done here too so the hook does
                // not depend on the order std does things in.
                check(libc::setpgid(0, 0))?;
                // A background group's tcsetpgrp raises SIGTTOU: blocked around the call.
                let mut ttou: libc::sigset_t = std::mem::zeroed();
                let mut previous: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut ttou);
                libc::sigaddset(&mut ttou, libc::SIGTTOU);
                libc::sigprocmask(libc::SIG_BLOCK, &ttou, &mut previous);
                let given = libc::tcsetpgrp(fd, libc::getpid());
                libc::sigprocmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                // The command still runs if the terminal could not be given (it is in
                // the background then, as it was before distlock gave terminals away).
                let _ = given;
            }
            Ok(())
        };
        // SAFETY: the hook only makes async-signal-safe calls and allocates nothing.
        unsafe { command.pre_exec(hook) };
    }

    /// One waitpid(2) for `pid` without blocking: its exit, stop or continue, if any
    /// happened since the last call.
    pub fn wait_for_change(pid: libc::pid_t) -> io::Result<Option<Event>> {
        let mut status: libc::c_int = 0;
        let flags = libc::WNOHANG | libc::WUNTRACED | libc::WCONTINUED;
        loop {
            // SAFETY: `status` is a local the call writes one integer to.
            let changed = unsafe { libc::waitpid(pid, &mut status, flags) };
            if changed == -1 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if changed == 0 {
                return Ok(None);
            }
            return Ok(Some(if libc::WIFSTOPPED(status) {
                Event::Stopped(libc::WSTOPSIG(status))
            } else if libc::WIFCONTINUED(status) {
                Event::Continued
            } else {
                Event::Exited(std::process::ExitStatus::from_raw(status))
            }));
        }
    }
}
