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

/// Whether the connection that produced `err` should be replaced before the next request:
/// it broke ([`breaks_connection`]), or its server was demoted to a replica (`READONLY`),
/// so the next connection looks for the primary again (behind Sentinel, the new one).
pub(crate) fn needs_new_connection(err: &RedisError) -> bool {
    breaks_connection(err) || err.code() == Some("READONLY")
}

/// `err`, met while doing `doing` on `node` (an address without credentials), as a
/// distlock error (the client's error as source); configuration mistakes say what to
/// change.
pub(crate) fn into_error(err: RedisError, doing: &str, node: &str) -> Error {
    let (kind, hint) = classify(&err);
    let error = Error::store(&format!("redis {node}"), doing, kind);
    match hint {
        Some(hint) => error.hint(hint),
        None => error,
    }
    .with_source(err)
}

fn classify(err: &RedisError) -> (ErrorKind, Option<&'static str>) {
    match err.code() {
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => return (ErrorKind::PermissionDenied, None),
        // A node that is loading, running a long script, out of memory (keys still expire),
        // short of replicas, failing over, or demoted to a replica may serve again soon.
        Some(
            "BUSY" | "LOADING" | "OOM" | "NOREPLICAS" | "MASTERDOWN" | "READONLY" | "TRYAGAIN"
            | "CLUSTERDOWN",
        ) => return (ErrorKind::Unavailable, None),
        Some("MOVED" | "ASK" | "CROSSSLOT") => {
            return (
                ErrorKind::Misconfigured,
                Some(
                    "the server is a Redis Cluster node, which is not supported: use standalone \
                     servers (one, or several under redis+redlock://)",
                ),
            )
        }
        _ => {}
    }
    if err
        .detail()
        .is_some_and(|d| d.contains("DB index is out of range"))
    {
        return (
            ErrorKind::Misconfigured,
            Some("the database index in the URL is beyond the server's `databases` setting"),
        );
    }
    match err.kind() {
        redis::ErrorKind::AuthenticationFailed
        | redis::ErrorKind::Server(ServerErrorKind::NoPerm) => (ErrorKind::PermissionDenied, None),
        redis::ErrorKind::InvalidClientConfig => (ErrorKind::InvalidInput, None),
        _ if breaks_connection(err) => (ErrorKind::Unavailable, None),
        // The TLS library's own failures (an I/O failure mid-handshake is an I/O error):
        // an untrusted or mismatched certificate does not fix itself by retrying.
        redis::ErrorKind::Client if is_tls_error(err) => (
            ErrorKind::Misconfigured,
            Some("the TLS handshake was refused (check the server certificate and TLS settings)"),
        ),
        _ => (ErrorKind::Internal, None),
    }
}

/// Whether `err` is the TLS library refusing the handshake, not an I/O failure during it.
#[cfg(feature = "tls")]
fn is_tls_error(err: &RedisError) -> bool {
    use std::error::Error as StdError;
    // The `redis` crate keeps the TLS error behind an `Arc<dyn Error>`.
    let Some(tls) = std::error::Error::source(err)
        .and_then(|s| s.downcast_ref::<std::sync::Arc<dyn StdError + Send + Sync>>())
        .filter(|inner| inner.is::<native_tls::Error>())
    else {
        return false;
    };
    let mut source = tls.source();
    while let Some(inner) = source {
        if inner.is::<std::io::Error>() {
            return false;
        }
        source = inner.source();
    }
    true
}

#[cfg(not(feature = "tls"))]
fn is_tls_error(_: &RedisError) -> bool {
    false
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
        let err = into_error(RedisError::from(io), "connect", "redis://h:1");
        assert_eq!(err.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn server_states_map_to_what_retrying_can_fix() {
        for (code, kind) in [
            ("BUSY", ErrorKind::Unavailable),
            ("LOADING", ErrorKind::Unavailable),
            ("OOM", ErrorKind::Unavailable),
            ("NOREPLICAS", ErrorKind::Unavailable),
            ("MASTERDOWN", ErrorKind::Unavailable),
            ("READONLY", ErrorKind::Unavailable),
            ("TRYAGAIN", ErrorKind::Unavailable),
            ("CLUSTERDOWN", ErrorKind::Unavailable),
            ("MOVED", ErrorKind::Misconfigured),
            ("ASK", ErrorKind::Misconfigured),
            ("CROSSSLOT", ErrorKind::Misconfigured),
            ("NOPERM", ErrorKind::PermissionDenied),
            ("WRONGPASS", ErrorKind::PermissionDenied),
            ("ERR", ErrorKind::Internal),
        ] {
            let err = redis::make_extension_error(code.into(), Some("something happened".into()));
            assert_eq!(
                into_error(err, "acquire", "redis://h:1/0").kind(),
                kind,
                "{code}"
            );
        }
        let err =
            redis::make_extension_error("ERR".into(), Some("DB index is out of range".into()));
        let err = into_error(err, "connect", "redis://h:1/99");
        assert_eq!(err.kind(), ErrorKind::Misconfigured);
        assert!(err.message().contains("databases"), "{err}");
    }
}
