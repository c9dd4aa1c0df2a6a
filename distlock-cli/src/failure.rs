//! Exit codes, and the one line a failure prints.

use std::error::Error as _;
use std::fmt;

use distlock::{Error, ErrorKind};

/// The lock was not acquired (the default of `-E`), or `status` found a free key.
pub const NOT_ACQUIRED: u8 = 1;
/// `break` released nothing: the key is free, or held under another token.
pub const NOT_BROKEN: u8 = 1;
/// Bad command line.
pub const USAGE: u8 = 2;
/// The store could not be used (sysexits' `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran (sysexits' `EX_TEMPFAIL`: running again may
/// succeed).
pub const LOST: u8 = 75;
/// The command exists but could not be executed (as in POSIX shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in POSIX shells).
pub const NOT_FOUND: u8 = 127;

/// The exit code of a process killed by signal `signal`, as shells report it.
pub fn killed_by(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// Why distlock stops early: an exit code and one line for stderr.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: u8,
    /// What went wrong, for people.
    pub message: String,
}

impl Failure {
    /// A failure with `code` saying `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A library error on `store` (shown redacted): its kind decides the exit code.
    pub fn from_store_error(err: &Error, store: &str) -> Self {
        let code = match err.kind() {
            // A scheme this build was compiled without is a usage problem too.
            ErrorKind::InvalidInput | ErrorKind::Unsupported => USAGE,
            ErrorKind::HeldByAnother | ErrorKind::TimedOut => NOT_ACQUIRED,
            ErrorKind::Lost => LOST,
            _ => UNAVAILABLE,
        };
        Failure::new(code, describe(err, store))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// `kind: what: cause (store URL)`, on one line, with the store's password hidden even if
/// a store client's message repeated it.
pub fn describe(err: &Error, store: &str) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Store clients often repeat their inner error in their own message.
        if !line.contains(&cause_text) {
            line.push_str(": ");
            line.push_str(&cause_text);
        }
        source = cause.source();
    }
    let line = distlock::redact_url_in(&line.replace('\n', " "), store);
    format!("{line} (store {})", distlock::redact_url(store))
}
