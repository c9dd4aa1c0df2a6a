//! Mapping `redis` crate errors into distlock's error kinds.

use lock_core::{Error, ErrorKind};
use redis::{RedisError, ServerErrorKind};

/// Whether the connection that produced `err` can no longer be trusted to pair requests
/// with replies (it timed out, broke, or was refused), so it must be replaced.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
}

/// `err`, raised while doing `what` against `node` (a redacted address), as a distlock error.
pub(crate) fn from_redis(err: RedisError, what: &str, node: &str) -> Error {
    let kind = classify(&err);
    Error::new(kind, format!("redis {node}: {what} failed")).with_source(err)
}

fn classify(err: &RedisError) -> ErrorKind {
    if matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM")) {
        return ErrorKind::PermissionDenied;
    }
    match err.kind() {
        redis::ErrorKind::AuthenticationFailed
        | redis::ErrorKind::Server(ServerErrorKind::NoPerm) => ErrorKind::PermissionDenied,
        redis::ErrorKind::InvalidClientConfig => ErrorKind::InvalidInput,
        // A node that is loading, failing over, or demoted to a replica may serve again soon.
        redis::ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => ErrorKind::Unavailable,
        _ if breaks_connection(err) => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}

/// A reply that does not have the shape a script returns.
pub(crate) fn unexpected_reply(what: &str, node: &str) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("redis {node}: unexpected reply to {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_failures_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = from_redis(RedisError::from(io), "connect", "redis://h:1");
        assert_eq!(err.kind(), ErrorKind::Unavailable);
    }
}
