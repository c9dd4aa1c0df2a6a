//! Signalling the server as a whole: its process group, plus the descendants that left the
//! group with `setsid` (PostgreSQL backends) and so are missed by a group signal.

use std::fs;
use std::io;
use std::time::Duration;

use tokio::time::Instant;

/// Sends `signal` to the group led by `leader` and to every descendant outside it.
pub(super) fn signal_tree(leader: u32, signal: libc::c_int) -> io::Result<()> {
    if signal == libc::SIGCONT {
        signal_each(&descendants(leader), signal);
    }
    signal_group(leader, signal)?;
    if signal != libc::SIGCONT {
        // The group leader is stopped first, so it forks no new workers meanwhile.
        signal_each(&descendants(leader), signal);
    }
    Ok(())
}

#[allow(unsafe_code)]
pub(super) fn signal_group(pid: u32, signal: libc::c_int) -> io::Result<()> {
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
pub(super) fn descendants(root: u32) -> Vec<u32> {
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

/// Blocks until none of `pids` runs any more, or for at most ten seconds.
pub(super) fn wait_until_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|pid| is_alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
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
pub(super) fn signal_each(pids: &[u32], signal: libc::c_int) {
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
