//! Why a scenario failed, and a scenario's result.

use std::fmt;

/// Why a scenario failed.
#[derive(Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<lock_core::Error> for Failure {
    fn from(err: lock_core::Error) -> Self {
        Failure(format!("unexpected error: {err} ({err:?})"))
    }
}

/// A scenario's result.
pub type Outcome = Result<(), Failure>;
