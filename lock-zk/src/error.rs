//! Mapping `zookeeper-client` errors into distlock's error kinds.

use lock_core::{Error, ErrorKind};
use zookeeper_client::Error as ZkError;

/// Whether `err` means the session is over for good: its nodes are gone, and new
/// acquisitions must use a new session. `SessionMoved` is not such an error: the session
/// lives on, on another server (the request went to the one it left), and ending it here
/// would delete every node of it.
pub(crate) fn ends_session(err: &ZkError) -> bool {
    matches!(err, ZkError::SessionExpired | ZkError::ClientClosed)
}

/// `err`, met while doing `doing`, as a distlock error (the client's error as source).
pub(crate) fn into_error(err: ZkError, doing: &str) -> Error {
    let kind = match &err {
        ZkError::NoAuth | ZkError::AuthFailed | ZkError::InvalidAcl => ErrorKind::PermissionDenied,
        ZkError::ConnectionLoss
        | ZkError::NoHosts
        | ZkError::Timeout
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::ClientClosed
        | ZkError::Throttled
        | ZkError::NotReadOnly
        // What the client reports for a connection that broke or fell silent ("no response
        // from connection in …", I/O failures): the request may not have been answered.
        | ZkError::Custom(_) => ErrorKind::Unavailable,
        ZkError::BadArguments(_) => ErrorKind::InvalidInput,
        ZkError::NoChildrenForEphemerals | ZkError::QuotaExceeded | ZkError::Unimplemented => {
            ErrorKind::Misconfigured
        }
        _ => ErrorKind::Internal,
    };
    let error = Error::store("zookeeper", doing, kind);
    match kind {
        ErrorKind::PermissionDenied => {
            error.hint("the credentials in the URL are refused for this path")
        }
        ErrorKind::Misconfigured => error.hint("check the lock root and the server's settings"),
        _ => error,
    }
    .with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_say_whether_retrying_helps() {
        for (err, kind) in [
            (ZkError::ConnectionLoss, ErrorKind::Unavailable),
            (ZkError::SessionExpired, ErrorKind::Unavailable),
            (ZkError::NoHosts, ErrorKind::Unavailable),
            (ZkError::NoAuth, ErrorKind::PermissionDenied),
            (ZkError::AuthFailed, ErrorKind::PermissionDenied),
            (ZkError::NoChildrenForEphemerals, ErrorKind::Misconfigured),
            (ZkError::BadVersion, ErrorKind::Internal),
        ] {
            assert_eq!(into_error(err, "acquire").kind(), kind);
        }
    }

    #[test]
    fn only_an_expired_or_closed_session_is_over() {
        assert!(ends_session(&ZkError::SessionExpired));
        assert!(ends_session(&ZkError::ClientClosed));
        for alive in [
            ZkError::SessionMoved,
            ZkError::ConnectionLoss,
            ZkError::Timeout,
        ] {
            assert!(!ends_session(&alive), "{alive:?}");
            assert_eq!(into_error(alive, "renew").kind(), ErrorKind::Unavailable);
        }
    }
}
