//! Dropping root for servers that refuse to run as root (see [`StoreSpec::run_as`]), both
//! for the server itself and for the setup commands that create its data.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::error::io_error;
use super::{StoreProcessError, StoreSpec};

/// The ids to run the spec's server as, when it names a user and we are root.
pub(super) fn spec_ids(spec: &StoreSpec) -> Result<Option<(u32, u32)>, StoreProcessError> {
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
pub(super) fn run_setup_command(mut command: Command, user: &str) -> io::Result<()> {
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
