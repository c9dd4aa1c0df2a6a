//! What answers at the other end of a connection: whether it is etcd at all, and whether
//! its version has the fixes the lease guarantees in the crate docs stand on.

use std::time::Duration;

use lock_core::{Error, ErrorKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// The first release of each etcd line with the fix for etcd issues 12528 and 15247
/// (etcd PR 16822, backported as 17465 to 3.4 and 17425 to 3.5): before it, a leader
/// whose raft loop is stuck keeps answering keep-alives after it lost the leadership, and
/// once unstuck revokes leases the new leader kept alive. Lines newer than the last entry
/// were branched after the fix.
pub(crate) const LEADER_FIXES: &[(u64, u64, u64)] = &[(3, 4, 31), (3, 5, 13), (3, 6, 0)];

/// `major.minor.patch` of a version string such as `3.4.23` or `3.6.0-rc.1` (a suffix
/// after the patch number is ignored).
pub(crate) fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.trim().trim_start_matches('v').splitn(3, '.');
    let mut number = |whole: bool| -> Option<u64> {
        let part = parts.next()?;
        let digits = if whole {
            part
        } else {
            let end = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            &part[..end]
        };
        digits.parse().ok()
    };
    Some((number(true)?, number(true)?, number(false)?))
}

/// Whether the etcd `version` has the stuck-leader fixes ([`LEADER_FIXES`]); `None` when
/// the version cannot be read.
pub(crate) fn has_leader_fixes(version: &str) -> Option<bool> {
    let found = parse_version(version)?;
    let newest = LEADER_FIXES.iter().max().copied()?;
    Some(
        match LEADER_FIXES
            .iter()
            .find(|f| (f.0, f.1) == (found.0, found.1))
        {
            Some(first_fixed) => found >= *first_fixed,
            None => found > newest,
        },
    )
}

/// Warns (once per connect) when the member that answered runs an etcd version without
/// the stuck-leader fixes: the crate's lease guarantees do not hold across a stuck
/// leader there. A warning, not a refusal: etcd 3.4.23 is what the tests run.
pub(crate) fn warn_if_unsafe(version: &str) {
    match has_leader_fixes(version) {
        Some(true) => tracing::debug!(version, "etcd server version"),
        Some(false) => tracing::warn!(
            version,
            "etcd {version} predates the fix for etcd issues 12528/15247 (first fixed in \
             3.4.31, 3.5.13 and 3.6.0): a leader stuck on a slow disk or CPU keeps \
             answering keep-alives, and revokes leases the new leader keeps alive, so a \
             lock can be granted to a rival before its holder sees lost(); upgrade etcd"
        ),
        None => tracing::warn!(
            version,
            "cannot read the etcd server version; distlock's lease guarantees need etcd \
             3.4.31, 3.5.13, 3.6.0 or later"
        ),
    }
}

/// The HTTP/2 connection preface and an empty SETTINGS frame: what a gRPC client sends
/// first. An HTTP/2 server answers with a SETTINGS frame of its own.
const HTTP2_PREFACE: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Whether `endpoint` answers the HTTP/2 preface as etcd's gRPC server does (with a
/// SETTINGS frame on stream 0). `None` when it cannot tell: nothing listens, or nothing
/// answered within `bound`.
pub(crate) async fn speaks_http2(endpoint: &str, bound: Duration) -> Option<bool> {
    let exchange = async {
        let mut stream = TcpStream::connect(endpoint).await.ok()?;
        stream.write_all(HTTP2_PREFACE).await.ok()?;
        let mut header = [0u8; 9];
        let mut read = 0;
        while read < header.len() {
            match stream.read(&mut header[read..]).await {
                // It answered something, then closed: not an HTTP/2 frame.
                Ok(0) => return Some(false),
                Ok(n) => read += n,
                Err(_) => return (read > 0).then_some(false),
            }
        }
        Some(is_settings_frame(&header))
    };
    timeout(bound, exchange).await.ok().flatten()
}

/// A frame header of type SETTINGS (4) on stream 0.
fn is_settings_frame(header: &[u8; 9]) -> bool {
    header[3] == 0x04 && header[5..9] == [0, 0, 0, 0]
}

/// Looks at each endpoint after connecting failed in a way etcd would not fail: the
/// error for the first one that answers but not as an HTTP/2 server.
pub(crate) async fn not_etcd(endpoints: &[String], bound: Duration) -> Option<Error> {
    let checks = endpoints
        .iter()
        .map(|endpoint| async move { (endpoint, speaks_http2(endpoint, bound).await) });
    futures_util::future::join_all(checks)
        .await
        .into_iter()
        .find(|(_, http2)| *http2 == Some(false))
        .map(|(endpoint, _)| {
            Error::new(
                ErrorKind::Misconfigured,
                format!(
                    "etcd: {endpoint} answers, but it is not an etcd server (it does not \
                     speak HTTP/2, as etcd's gRPC API does); check the host and port"
                ),
            )
        })
}

/// The error for an endpoint that speaks gRPC but not etcd's API.
pub(crate) fn not_etcd_api(endpoints: &[String], source: etcd_client::Error) -> Error {
    Error::new(
        ErrorKind::Misconfigured,
        format!(
            "etcd: {} answers gRPC, but it is not an etcd server (no etcd API there); \
             check the host and port",
            endpoints.join(",")
        ),
    )
    .with_source(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read() {
        assert_eq!(parse_version("3.4.23"), Some((3, 4, 23)));
        assert_eq!(parse_version("v3.5.13"), Some((3, 5, 13)));
        assert_eq!(parse_version("3.6.0-rc.1"), Some((3, 6, 0)));
        assert_eq!(parse_version("3.6"), None);
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version("x.4.1"), None);
    }

    #[test]
    fn the_first_fixed_release_of_each_line_counts() {
        for (version, fixed) in [
            ("3.3.27", false),
            ("3.4.23", false),
            ("3.4.30", false),
            ("3.4.31", true),
            ("3.4.40", true),
            ("3.5.0", false),
            ("3.5.12", false),
            ("3.5.13", true),
            ("3.5.21", true),
            ("3.6.0-alpha.0", true),
            ("3.6.0", true),
            ("3.7.1", true),
            ("4.0.0", true),
            ("2.3.8", false),
        ] {
            assert_eq!(has_leader_fixes(version), Some(fixed), "{version}");
        }
        assert_eq!(has_leader_fixes("unknown"), None);
    }

    #[test]
    fn only_a_settings_frame_is_http2() {
        assert!(is_settings_frame(&[0, 0, 6, 4, 0, 0, 0, 0, 0]));
        assert!(!is_settings_frame(b"HTTP/1.1 "));
        assert!(!is_settings_frame(b"-ERR unkn"));
        assert!(!is_settings_frame(&[0, 0, 6, 4, 0, 0, 0, 0, 1]));
    }
}
