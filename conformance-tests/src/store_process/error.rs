use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::process::ExitStatus;
use std::time::Duration;

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

pub(super) fn io_error(action: impl Into<String>) -> impl FnOnce(io::Error) -> StoreProcessError {
    let action = action.into();
    move |source| StoreProcessError::Io { action, source }
}
