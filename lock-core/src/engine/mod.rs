//! The acquisition and renewal engine under the user layer: how a lease is acquired
//! (polling or a fair queue), kept (one renewal engine per client), given back, and shared
//! by a reentrant owner's tasks.

use crate::backend::DynBackend;

pub(crate) mod acquire;
pub(crate) mod cleanup;
pub(crate) mod held;
pub(crate) mod local;
pub(crate) mod poll;
pub(crate) mod queue;
pub(crate) mod reentry;
pub(crate) mod renewal;

/// What every clone of a client shares: the backend, the client's renewal engine and the
/// local lines its tasks wait in.
#[derive(Debug)]
pub(crate) struct ClientCore {
    pub(crate) backend: DynBackend,
    pub(crate) renewals: renewal::Renewals,
    pub(crate) local: local::LocalLines,
}

impl ClientCore {
    pub(crate) fn new(backend: DynBackend) -> Self {
        ClientCore {
            renewals: renewal::Renewals::new(backend.clone()),
            local: local::LocalLines::default(),
            backend,
        }
    }
}

/// The outcome's name for tracing spans.
pub(crate) fn outcome_name<T>(result: &crate::Result<T>) -> &'static str {
    use crate::ErrorKind;
    match result {
        Ok(_) => "ok",
        Err(err) => match err.kind() {
            ErrorKind::HeldByAnother => "held_by_another",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Lost => "lost",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Misconfigured => "misconfigured",
            _ => "internal",
        },
    }
}
