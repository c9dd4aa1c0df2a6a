//! The command run under the lock: started in a process group of its own, so that a
//! signal reaches everything it started (a shell's children too), and its exit status
//! turned into distlock's.

use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::ExitStatus;

use tokio::process::{Child, Command};

use crate::failure::{killed_by, Failure, CANNOT_EXECUTE, NOT_FOUND};

/// What to run: an argument vector, or a string for `sh -c`.
pub enum Program<'a> {
    /// `COMMAND [ARGS...]`.
    Argv(&'a [String]),
    /// `-c 'shell string'`.
    Shell(&'a str),
}

/// A started command, leading its own process group.
pub struct Group {
    child: Child,
    /// The group id: the child's pid.
    id: libc::pid_t,
}

impl Group {
    /// Starts `program` with `env` added, as the leader of a new process group.
    pub fn spawn(program: &Program<'_>, env: &[(&str, String)]) -> Result<Group, Failure> {
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
        let child = Command::from(command).spawn().map_err(|err| {
            let code = match err.kind() {
                io::ErrorKind::NotFound => NOT_FOUND,
                _ => CANNOT_EXECUTE,
            };
            Failure::new(code, format!("cannot run {shown:?}: {err}"))
        })?;
        let id = child
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .ok_or_else(|| Failure::new(CANNOT_EXECUTE, "the command has no process id"))?;
        Ok(Group { child, id })
    }

    /// Waits for the group's leader (the command) to exit. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Sends `signal` to every process of the group.
    ///
    /// Used while the leader has not been reaped, or (after a lost lock) while some other
    /// member keeps the group alive: in both cases the id cannot have been reused, because
    /// the kernel does not hand out a pid still in use as a process group id. If the group
    /// is empty the call fails with `ESRCH` and changes nothing.
    #[allow(unsafe_code)]
    pub fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        // SAFETY: kill(2) takes plain integers and touches none of our memory; a negative
        // pid addresses the process group, which is ours (see above).
        match unsafe { libc::kill(-self.id, signal) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Whether any process of the group is still alive. Zombies do not count: an orphan
    /// is reaped by init, and some inits (in containers) take their time or never do.
    pub fn has_live_members(&self) -> bool {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            // No /proc: signal 0 checks for existence (zombies included), delivers nothing.
            return self.signal(0).is_ok();
        };
        entries.filter_map(Result::ok).any(|entry| {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                return false;
            };
            // `pid (comm) state ppid pgrp ...`; comm may contain spaces and parentheses.
            let Some(after) = stat.rfind(')').map(|end| &stat[end + 1..]) else {
                return false;
            };
            let mut fields = after.split_whitespace();
            let state = fields.next();
            let group = fields
                .nth(1)
                .and_then(|pgrp| pgrp.parse::<libc::pid_t>().ok());
            group == Some(self.id) && state != Some("Z")
        })
    }
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
