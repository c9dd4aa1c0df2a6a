//! etcd and gRPC errors mapped into distlock's kinds; the client's error stays the source.

use lock_core::{Error, ErrorKind};
use tonic::Code;

/// `err`, met while doing `doing`, as a distlock error (the client's error as source).
pub(crate) fn into_error(err: etcd_client::Error, doing: &str) -> Error {
    Error::store("etcd", doing, kind_of(&err)).with_source(err)
}

pub(crate) fn kind_of(err: &etcd_client::Error) -> ErrorKind {
    use etcd_client::Error as E;
    match err {
        E::GRpcStatus(status) => status_kind(status.code(), status.message()),
        // The connection could not be made or broke; the keep-alive and watch streams end
        // the same way when their connection goes.
        E::TransportError(_)
        | E::IoError(_)
        | E::WatchError(_)
        | E::LeaseKeepAliveError(_)
        | E::EndpointError(_) => ErrorKind::Unavailable,
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            ErrorKind::InvalidInput
        }
        _ => ErrorKind::Internal,
    }
}

/// etcd reports several authentication failures as `InvalidArgument` and a missing
/// leader as `Unavailable` or `Unknown`, so the message decides where the code does not.
fn status_kind(code: Code, message: &str) -> ErrorKind {
    const AUTH: [&str; 5] = [
        "authentication failed",
        "user name is empty",
        "invalid auth token",
        "permission denied",
        "authentication is not enabled",
    ];
    const TRANSIENT: [&str; 6] = [
        "no leader",
        "leader changed",
        "request timed out",
        "too many requests",
        "server stopped",
        "not capable",
    ];
    if AUTH.iter().any(|m| message.contains(m)) {
        return ErrorKind::PermissionDenied;
    }
    if TRANSIENT.iter().any(|m| message.contains(m)) {
        return ErrorKind::Unavailable;
    }
    match code {
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::PermissionDenied,
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::ResourceExhausted
        | Code::Unknown => ErrorKind::Unavailable,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            ErrorKind::InvalidInput
        }
        _ => ErrorKind::Internal,
    }
}

/// Whether etcd refused a write because the lease it names is gone.
pub(crate) fn is_lease_not_found(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            status.message().contains("requested lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_map_to_kinds() {
        let cases = [
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
                ErrorKind::PermissionDenied,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty",
                ErrorKind::PermissionDenied,
            ),
            (
                Code::PermissionDenied,
                "etcdserver: permission denied",
                ErrorKind::PermissionDenied,
            ),
            (
                Code::Unavailable,
                "etcdserver: no leader",
                ErrorKind::Unavailable,
            ),
            (
                Code::Unknown,
                "etcdserver: request timed out",
                ErrorKind::Unavailable,
            ),
            (
                Code::Unavailable,
                "connection refused",
                ErrorKind::Unavailable,
            ),
            (Code::Internal, "boom", ErrorKind::Internal),
        ];
        for (code, message, kind) in cases {
            assert_eq!(status_kind(code, message), kind, "{code:?} {message}");
        }
    }

    #[test]
    fn the_client_error_is_the_source() {
        let err = into_error(
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader")),
            "acquire",
        );
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(err.message(), "etcd: acquire failed");
    }
}
