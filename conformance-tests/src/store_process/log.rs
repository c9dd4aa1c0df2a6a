//! The server's combined stdout/stderr log, which outlives restarts and is quoted in errors.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// How much of the end of the server's log an error quotes.
const LOG_TAIL_BYTES: u64 = 4096;

pub(super) fn read_tail(path: &Path) -> String {
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
