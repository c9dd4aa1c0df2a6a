//! A pseudo-terminal for the job-control tests: distlock as the session leader of a
//! terminal of its own, in its foreground, as a command typed at a prompt is (minus the
//! shell), while the test types on the other side.

#![allow(unsafe_code)] // The few libc calls a pseudo-terminal needs; see each SAFETY note.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use super::PATIENCE;

/// A process running on a new pseudo-terminal.
pub struct Terminal {
    /// The process's pid, also its session and process group.
    pub pid: u32,
    master: File,
    output: Receiver<String>,
    exit: Receiver<ExitStatus>,
    seen: std::sync::Mutex<Vec<String>>,
}

/// Where the process's standard input comes from.
pub enum Input {
    /// The terminal, as for a command typed at a prompt.
    Terminal,
    /// /dev/null: the process still has the terminal (its stdout, stderr, and /dev/tty).
    Null,
}

impl Terminal {
    /// Starts `command` as the session leader of a new pseudo-terminal, which becomes its
    /// controlling terminal, with stdout and stderr on it.
    pub fn spawn(mut command: Command, input: Input) -> Terminal {
        let (master, slave) = open_pty();
        let stdin = match input {
            Input::Terminal => Stdio::from(slave.try_clone().expect("dup the terminal")),
            Input::Null => Stdio::null(),
        };
        command
            .stdin(stdin)
            .stdout(Stdio::from(slave.try_clone().expect("dup the terminal")))
            .stderr(Stdio::from(slave));
        let hook = || {
            // SAFETY: async-signal-safe calls on integers, as pre_exec requires.
            unsafe {
                if libc::setsid() == -1 || libc::ioctl(1, libc::TIOCSCTTY, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        };
        // SAFETY: the hook makes only async-signal-safe calls and allocates nothing.
        unsafe { command.pre_exec(hook) };
        let mut child = command.spawn().expect("start on the terminal");
        // The test's copies of the terminal's side go with `command`: once the process
        // tree has closed it, reading the master ends.
        drop(command);
        let pid = child.id();
        let (exit_tx, exit) = channel();
        std::thread::spawn(move || {
            let status = child.wait().expect("wait");
            let _ = exit_tx.send(status);
        });
        let (output_tx, output) = channel();
        let mut reader = master.try_clone().expect("dup the master");
        std::thread::spawn(move || {
            let mut pending = Vec::new();
            let mut buffer = [0u8; 4096];
            // Ends with EIO once no process has the terminal open.
            while let Ok(read) = reader.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                pending.extend_from_slice(&buffer[..read]);
                while let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let text = String::from_utf8_lossy(&line);
                    if output_tx
                        .send(text.trim_end_matches(['\r', '\n']).to_string())
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
        Terminal {
            pid,
            master,
            output,
            exit,
            seen: std::sync::Mutex::default(),
        }
    }

    /// Types `text` (a line needs its "\n"; Ctrl-Z is "\x1a").
    pub fn type_text(&self, text: &str) {
        (&self.master)
            .write_all(text.as_bytes())
            .expect("write to the terminal");
    }

    /// Waits for an output line containing `expected` (the terminal echoes what is typed).
    pub fn line_containing(&self, expected: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(line) if line.contains(expected) => return,
                Ok(line) => self.seen.lock().expect("seen").push(line),
                Err(_) => panic!(
                    "no line {expected:?} on the terminal within {PATIENCE:?}; saw {:?}",
                    self.seen.lock().expect("seen")
                ),
            }
        }
    }

    /// Waits for the exit.
    pub fn exit(&self, within: Duration) -> ExitStatus {
        self.exit.recv_timeout(within).unwrap_or_else(|_| {
            panic!(
                "pid {} did not exit within {within:?}; the terminal showed {:?}",
                self.pid,
                self.seen.lock().expect("seen")
            )
        })
    }
}

impl Drop for Terminal {
    /// A test that failed half-way leaves nothing behind: the session's leader's group
    /// (distlock) and, through the hang-up of its terminal, its foreground group.
    fn drop(&mut self) {
        if matches!(
            self.exit.try_recv(),
            Err(std::sync::mpsc::TryRecvError::Empty)
        ) {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.pid)])
                .status();
        }
    }
}

/// A new pseudo-terminal: its master and its terminal side.
fn open_pty() -> (File, OwnedFd) {
    // SAFETY: posix_openpt, grantpt, unlockpt and ptsname_r take integers and a local
    // buffer of the stated length; each fd is owned exactly once below.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(
            master >= 0,
            "posix_openpt: {}",
            std::io::Error::last_os_error()
        );
        let master = File::from_raw_fd(master);
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0, "grantpt");
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r"
        );
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .expect("utf-8 terminal name")
            .to_string();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&path)
            .expect("open the terminal side");
        (master, OwnedFd::from(slave))
    }
}
