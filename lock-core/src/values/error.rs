//! The one error type every backend maps into.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// What went wrong, independent of the store. The conformance suite asserts on these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The key is held by another lease and the caller asked not to wait (would block).
    HeldByAnother,
    /// The wait bound passed while the key stayed held by another lease.
    TimedOut,
    /// The lease is no longer held: it expired, or the key now belongs to someone else.
    Lost,
    /// The request was refused before touching the store (bad key, TTL, URL, option).
    InvalidInput,
    /// The backend cannot do this (see its capabilities).
    Unsupported,
    /// The store could not be reached or did not answer in time. Retrying may help.
    Unavailable,
    /// The store refused the credentials or the operation.
    PermissionDenied,
    /// The store answers but is set up in a way the backend cannot work with (no such
    /// database, a lock table of the wrong shape, a Redis database index out of range, an
    /// eviction policy that can drop locks). Retrying will not help; the message says what
    /// to change.
    Misconfigured,
    /// A bug or an unexpected store reply.
    Internal,
}

impl ErrorKind {
    /// Whether the same call may succeed if retried later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::HeldByAnother | ErrorKind::TimedOut | ErrorKind::Unavailable
        )
    }

    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::HeldByAnother => "held by another",
            ErrorKind::TimedOut => "timed out",
            ErrorKind::Lost => "lost",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Misconfigured => "misconfigured",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of every distlock operation: a kind to match on, a message for people and,
/// for store failures, the store client's error as [`source`](StdError::source).
///
/// Cloning is cheap, so one failure can be handed to every observer of a lost lock.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: Cow<'static, str>,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl Error {
    /// An error of `kind` with a message saying what happened.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A store failure, for backend crates mapping their client's errors: `{store}: {doing}
    /// failed` (`redis 127.0.0.1:6379: acquire failed`). `store` names the store (and the
    /// node, where there are several) and `doing` what was being done; neither may carry a
    /// credential. Add what to change with [`hint`](Self::hint) and the client's error
    /// with [`with_source`](Self::with_source).
    pub fn store(store: &str, doing: &str, kind: ErrorKind) -> Self {
        Error::new(kind, format!("{store}: {doing} failed"))
    }

    /// Appends `: {hint}` to the message: what the user can change, or what the store's
    /// answer means.
    pub fn hint(mut self, hint: &str) -> Self {
        self.message = format!("{}: {hint}", self.message).into();
        self
    }

    /// Attaches the underlying (store client) error.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable description, without the source.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the same call may succeed if retried later.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }

    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    pub(crate) fn lost(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Lost, message)
    }

    /// An [`ErrorKind::Misconfigured`] error saying what to fix.
    pub fn misconfigured(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Misconfigured, message)
    }

    pub(crate) fn unavailable(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Unavailable, message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(source) = &self.source {
            d.field("source", &format_args!("{source}"));
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

/// `Result` with distlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_kinds() {
        assert!(ErrorKind::Unavailable.is_retryable());
        assert!(ErrorKind::HeldByAnother.is_retryable());
        assert!(!ErrorKind::Lost.is_retryable());
        assert!(!ErrorKind::InvalidInput.is_retryable());
        assert!(!ErrorKind::Misconfigured.is_retryable());
    }

    #[test]
    fn store_errors_name_the_store_and_what_was_done() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::store("redis 127.0.0.1:6379", "acquire", ErrorKind::Unavailable)
            .hint("is the server up?")
            .with_source(io);
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(
            err.to_string(),
            "unavailable: redis 127.0.0.1:6379: acquire failed: is the server up?"
        );
        assert!(err.source().is_some());
        let plain = Error::store("etcd", "watching a key", ErrorKind::Internal);
        assert_eq!(plain.message(), "etcd: watching a key failed");
    }

    #[test]
    fn source_is_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::unavailable("store down").with_source(io);
        assert_eq!(err.to_string(), "unavailable: store down");
        assert!(err.source().is_some_and(|s| s.to_string() == "refused"));
    }
}
