//! Options of a Redis or Redlock client, parsed from a URL.

use std::fmt;
use std::time::Duration;

use lock_core::{redact_url, Error, ErrorKind, Result};

const DEFAULT_PORT: u16 = 6379;

/// How to reach Redis and how to lay out the locks there.
///
/// Parsed from a URL by [`RedisConfig::from_url`]:
///
/// * single node: `redis://[user:password@]host[:port][/db][?option=value&...]`
///   (`rediss://` for TLS, with this crate's `tls` feature);
/// * Redlock over independent nodes, sharing credentials, database and options:
///   `redis+redlock://[user:password@]host1:port1,host2:port2,host3:port3[/db][?...]`
///   (`rediss+redlock://` for TLS). Use an odd number of nodes, usually five.
///
/// Options (all optional):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `key_prefix` | `distlock:` | namespace of every Redis key this client writes; no `{ } * ? [ ] \` |
/// | `connect_timeout_ms` | 2000 | bound on establishing a connection |
/// | `response_timeout_ms` | 5000 | bound on one reply on an established connection |
/// | `node_timeout_ms` | 200 | Redlock only: bound on one node's reply during a quorum operation |
/// | `durable` | `false` | assert that every node runs with `appendonly yes` and `appendfsync always`, so fencing counters survive restarts (see the crate docs) |
///
/// Credentials never appear in `Debug` output or error messages.
#[derive(Clone)]
pub struct RedisConfig {
    nodes: Vec<String>,
    redlock: bool,
    /// Namespace of every Redis key and channel this client uses.
    pub key_prefix: String,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Bound on one reply on an established connection.
    pub response_timeout: Duration,
    /// Redlock only: bound on one node's reply during a quorum operation. Keep it far
    /// below the TTLs in use: a quorum operation takes up to this long when a node is silent.
    pub node_timeout: Duration,
    /// The operator asserts that every node persists each write before answering (AOF with
    /// `appendfsync always`), so fencing counters survive a restart; declared as
    /// `durable_fencing` in the capabilities.
    pub durable: bool,
    /// Single node only: subscribe to release notifications through this URL instead of
    /// the node's own (a replica, which receives the node's messages, or a proxy).
    pub subscriber_url: Option<String>,
}

impl RedisConfig {
    /// Parses a `redis://`, `rediss://`, `redis+redlock://` or `rediss+redlock://` URL.
    /// A malformed URL or an unknown option is [`ErrorKind::InvalidInput`] naming the problem.
    pub fn from_url(url: &str) -> Result<Self> {
        let shown = redact_url(url);
        let invalid = |why: String| Error::new(ErrorKind::InvalidInput, format!("{shown}: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("not a URL (expected redis://host:port)".into()))?;
        let (tls, redlock) = match scheme {
            "redis" => (false, false),
            "rediss" => (true, false),
            "redis+redlock" => (false, true),
            "rediss+redlock" => (true, true),
            other => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?} (expected one of {:?})",
                    crate::SCHEMES
                )))
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{shown}: TLS (rediss://) needs the `tls` feature of lock-redis"),
            ));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let db = if path.is_empty() {
            0
        } else {
            path.parse::<u32>()
                .map_err(|_| invalid(format!("database {path:?} is not a number")))?
        };
        let node_scheme = if tls { "rediss" } else { "redis" };
        let mut nodes = Vec::new();
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(invalid("a host is missing".into()));
            }
            // `[::1]` is an IPv6 address without a port, `[::1]:7000` one with.
            let host_port = match host.rsplit_once(':') {
                Some((name, port)) if !host.ends_with(']') => {
                    let port: u16 = port
                        .parse()
                        .map_err(|_| invalid(format!("port {port:?} is not a number")))?;
                    format!("{name}:{port}")
                }
                _ => format!("{host}:{DEFAULT_PORT}"),
            };
            let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
            nodes.push(format!("{node_scheme}://{auth}{host_port}/{db}"));
        }
        if !redlock && nodes.len() != 1 {
            return Err(invalid(
                "several hosts need the redis+redlock:// scheme".into(),
            ));
        }
        let mut config = RedisConfig {
            nodes,
            redlock,
            ..RedisConfig::defaults()
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let millis = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| invalid(format!("{name}={value:?} is not a positive number")))
            };
            match name {
                "key_prefix" => config.key_prefix = value.to_string(),
                "connect_timeout_ms" => config.connect_timeout = millis()?,
                "response_timeout_ms" => config.response_timeout = millis()?,
                "node_timeout_ms" => config.node_timeout = millis()?,
                "durable" => {
                    config.durable = match value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => {
                            return Err(invalid(format!("durable={value:?} is not true or false")))
                        }
                    }
                }
                other => return Err(invalid(format!("unknown option {other:?}"))),
            }
        }
        config.validate()?;
        Ok(config)
    }

    fn defaults() -> Self {
        RedisConfig {
            nodes: Vec::new(),
            redlock: false,
            key_prefix: "distlock:".to_string(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            node_timeout: Duration::from_millis(200),
            durable: false,
            subscriber_url: None,
        }
    }

    /// Whether this is a Redlock (quorum) configuration.
    pub fn is_redlock(&self) -> bool {
        self.redlock
    }

    /// How many nodes the configuration names.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Refuses options that would break the key layout.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(bad) = self
            .key_prefix
            .chars()
            .find(|c| matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\') || c.is_control())
        {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "key_prefix {:?} contains {bad:?}, which would change the key's hash slot or \
                     its SCAN pattern",
                    self.key_prefix
                ),
            ));
        }
        if self.nodes.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "no Redis node configured",
            ));
        }
        Ok(())
    }

    /// Node URLs, without options, as the `redis` crate parses them.
    pub(crate) fn node_urls(&self) -> &[String] {
        &self.nodes
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        f.debug_struct("RedisConfig")
            .field("nodes", &nodes)
            .field("redlock", &self.redlock)
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("durable", &self.durable)
            .field(
                "subscriber_url",
                &self.subscriber_url.as_deref().map(redact_url),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_node_with_options() {
        let config = RedisConfig::from_url(
            "redis://u:s3cret@127.0.0.1:7000/2?key_prefix=app:&connect_timeout_ms=100&durable=true",
        )
        .unwrap();
        assert!(!config.is_redlock());
        assert_eq!(config.node_urls(), ["redis://u:s3cret@127.0.0.1:7000/2"]);
        assert_eq!(config.key_prefix, "app:");
        assert_eq!(config.connect_timeout, Duration::from_millis(100));
        assert!(config.durable);
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn redlock_nodes_share_credentials() {
        let config =
            RedisConfig::from_url("redis+redlock://:pw@a:1,b:2,c/0?node_timeout_ms=50").unwrap();
        assert!(config.is_redlock());
        assert_eq!(
            config.node_urls(),
            [
                "redis://:pw@a:1/0",
                "redis://:pw@b:2/0",
                "redis://:pw@c:6379/0"
            ]
        );
        assert_eq!(config.node_timeout, Duration::from_millis(50));
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, needle) in [
            ("http://h", "unsupported scheme"),
            ("redis://h:x", "port"),
            ("redis://h/abc", "database"),
            ("redis://a,b", "redis+redlock"),
            ("redis://h?colour=red", "unknown option"),
            ("redis://h?key_prefix=a{b}", "key_prefix"),
            ("redis://u:pw@h?connect_timeout_ms=0", "connect_timeout_ms"),
        ] {
            let err = RedisConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
            assert!(err.message().contains(needle), "{url}: {err}");
            assert!(!err.message().contains(":pw@"), "{err}");
        }
    }
}
