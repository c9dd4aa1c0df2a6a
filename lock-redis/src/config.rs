//! Options of a Redis or Redlock client, parsed from a URL.

use std::collections::HashSet;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use lock_core::backend::StoreUrl;
use lock_core::{Capabilities, Error, ErrorKind, Liveness, Result};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

const DEFAULT_PORT: u16 = 6379;
/// Sentinel's own default port.
const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The URL schemes [`RedisConfig::from_url`] accepts (`rediss` ones need the `tls` feature).
pub(crate) const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+redlock",
    "rediss+redlock",
    "redis+sentinel",
];

/// How to reach Redis and how to lay out the locks there.
///
/// Parsed from a URL by [`RedisConfig::from_url`] (the scheme is case-insensitive):
///
/// * single node: `redis://[user:password@]host[:port][/db][?option=value&...]`
///   (`rediss://` for TLS, with this crate's `tls` feature);
/// * Redlock over independent nodes, sharing credentials, database and options:
///   `redis+redlock://[user:password@]host1:port1,host2:port2,host3:port3[/db][?...]`
///   (`rediss+redlock://` for TLS). Use an odd number of nodes, usually five; the same
///   `host:port` twice is refused, since one server would then count as two votes;
/// * a primary found through Redis Sentinel:
///   `redis+sentinel://[user:password@]sentinel1:port1,sentinel2:port2[,...]/master-name[/db][?...]`
///   (sentinel port 26379 by default). The credentials and database are the primary's; the
///   sentinels are asked without credentials. The primary is looked up when a connection is
///   made and again after a failover (see the crate docs, *Sentinel*).
///
/// A reserved character (`/ ? # @ : %`) in the user name or password must be
/// percent-encoded (`p/ss` as `p%2Fss`); the decoded password is handed to the Redis client
/// as is, never pasted back into a URL.
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
/// | `allow_eviction` | `false` | accept servers whose `maxmemory-policy` is not `noeviction`; fencing is then not durable and a lock can vanish (see the crate docs) |
/// | `replicas` | off | single node or Sentinel only: after each grant, renewal or record write, `WAIT` until this many replicas have it (a positive number, or `all` for every replica online at the time), else roll a grant back and fail as [`ErrorKind::Unavailable`] (see the crate docs) |
/// | `replica_timeout_ms` | 100 | with `replicas`: how long to wait for the replicas; below `response_timeout_ms` |
///
/// Credentials never appear in `Debug` output or error messages.
#[derive(Clone)]
pub struct RedisConfig {
    nodes: Vec<NodeAddr>,
    redlock: bool,
    /// Behind Sentinel: the name the sentinels monitor the primary under (`nodes` are then
    /// the sentinels).
    sentinel_master: Option<String>,
    tls: bool,
    username: Option<String>,
    password: Option<String>,
    db: i64,
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
    /// `durable_fencing` in the capabilities (unless [`allow_eviction`](Self::allow_eviction)).
    pub durable: bool,
    /// Accept servers that may evict keys (`maxmemory-policy` other than `noeviction`).
    /// Eviction can drop a live lock or a fencing counter, so with this set the
    /// capabilities declare `durable_fencing: false`; without it such a server is refused
    /// with [`ErrorKind::Misconfigured`] at connect.
    pub allow_eviction: bool,
    /// Single node only: subscribe to release notifications through this URL instead of
    /// the node's own (a replica, which receives the node's messages, or a proxy).
    pub subscriber_url: Option<String>,
    /// Single node only: how many replicas must confirm each grant, renewal and record
    /// write (`WAIT`) before it counts; `None` (the default) confirms nothing.
    pub replicas: Option<Replicas>,
    /// With [`replicas`](Self::replicas): how long one confirmation may wait. It stalls the
    /// node's one connection meanwhile, so keep it short; below the response time-out.
    pub replica_timeout: Duration,
}

/// How many replicas must confirm a write (the `replicas` URL option).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// At least this many.
    Count(NonZeroU32),
    /// Every replica the primary reports online (`INFO replication`) just after the write;
    /// none when it has none, so a primary that lost all its replicas still grants.
    AllConnected,
}

/// One server of a configuration.
#[derive(Clone, PartialEq, Eq, Hash)]
struct NodeAddr {
    /// Host name or address, IPv6 without brackets (as the socket layer takes it).
    host: String,
    port: u16,
}

/// What a [`Node`](crate::node::Node) needs to connect: the address to show in messages
/// (no credentials) and the connection settings for the `redis` crate.
pub(crate) struct NodeTarget {
    pub(crate) shown: String,
    pub(crate) info: ConnectionInfo,
}

impl RedisConfig {
    /// Parses a `redis://`, `rediss://`, `redis+redlock://`, `rediss+redlock://` or
    /// `redis+sentinel://` URL.
    /// A malformed URL or an unknown option is [`ErrorKind::InvalidInput`] naming the problem
    /// (never repeating the password).
    pub fn from_url(url: &str) -> Result<Self> {
        let mut url = StoreUrl::parse(url)?;
        let scheme = url.expect_scheme(SCHEMES)?;
        let (tls, redlock) = (scheme.starts_with("rediss"), scheme.ends_with("+redlock"));
        let sentinel = scheme.ends_with("+sentinel");
        if tls && !cfg!(feature = "tls") {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{url}: TLS (rediss://) needs the `tls` feature of lock-redis"),
            ));
        }
        // Behind Sentinel the path is `master-name[/db]`, else `[db]`.
        let (sentinel_master, db) = if sentinel {
            match url.path().split_once('/') {
                Some((name, db)) => (name, db),
                None => (url.path(), ""),
            }
        } else {
            ("", url.path())
        };
        let sentinel_master = match sentinel_master {
            "" if sentinel => return Err(url.error("no master name (redis+sentinel://hosts/name)")),
            "" => None,
            name => Some(name.to_string()),
        };
        let db = match db {
            "" => 0,
            path => path
                .parse::<u32>()
                .map_err(|_| url.error(&format!("database {path:?} is not a number")))?,
        };
        let default_port = if sentinel {
            DEFAULT_SENTINEL_PORT
        } else {
            DEFAULT_PORT
        };
        let nodes: Vec<NodeAddr> = url
            .hosts()
            .iter()
            .map(|h| NodeAddr {
                host: h.host.trim_start_matches('[').trim_end_matches(']').into(),
                port: h.port.unwrap_or(default_port),
            })
            .collect();
        if !redlock && !sentinel && nodes.len() != 1 {
            return Err(url.error("several hosts need the redis+redlock:// scheme"));
        }
        let mut seen = HashSet::new();
        if let Some(twice) = nodes.iter().find(|node| !seen.insert(*node)) {
            let why = if sentinel {
                "a sentinel listed twice is a mistyped address"
            } else {
                "one server would count as two votes of the majority"
            };
            return Err(url.error(&format!("{} is named twice; {why}", twice.display())));
        }
        if redlock && nodes.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = nodes.len(),
                "an even number of Redlock nodes tolerates no more failures than one node fewer"
            );
        }
        let defaults = RedisConfig::defaults();
        let replicas = take_replicas(&mut url)?;
        let replica_timeout = url.take_millis("replica_timeout_ms")?;
        if redlock && (replicas.is_some() || replica_timeout.is_some()) {
            return Err(url.error(
                "replicas and replica_timeout_ms are for one primary with replicas; Redlock's \
                 nodes are independent primaries, each its own vote",
            ));
        }
        if replicas.is_none() && replica_timeout.is_some() {
            return Err(url.error("replica_timeout_ms needs replicas"));
        }
        let config = RedisConfig {
            replicas,
            replica_timeout: replica_timeout.unwrap_or(defaults.replica_timeout),
            key_prefix: url.take_param("key_prefix").unwrap_or(defaults.key_prefix),
            connect_timeout: url
                .take_millis("connect_timeout_ms")?
                .unwrap_or(defaults.connect_timeout),
            response_timeout: url
                .take_millis("response_timeout_ms")?
                .unwrap_or(defaults.response_timeout),
            node_timeout: url
                .take_millis("node_timeout_ms")?
                .unwrap_or(defaults.node_timeout),
            durable: url.take_flag("durable")?.unwrap_or(defaults.durable),
            allow_eviction: url
                .take_flag("allow_eviction")?
                .unwrap_or(defaults.allow_eviction),
            nodes,
            redlock,
            sentinel_master,
            tls,
            username: Some(url.username().to_string()).filter(|u| !u.is_empty()),
            password: url.password().map(str::to_string),
            db: i64::from(db),
            subscriber_url: None,
        };
        url.finish()?;
        config.validate()?;
        Ok(config)
    }

    fn defaults() -> Self {
        RedisConfig {
            nodes: Vec::new(),
            redlock: false,
            sentinel_master: None,
            tls: false,
            username: None,
            password: None,
            db: 0,
            key_prefix: "distlock:".to_string(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            node_timeout: Duration::from_millis(200),
            durable: false,
            allow_eviction: false,
            subscriber_url: None,
            replicas: None,
            // Replicas on one network acknowledge within a millisecond or two (WAIT asks them
            // at once); a hundred times that rides out a busy moment, while a stalled replica
            // costs an acquisition little and holds the shared connection up only briefly.
            replica_timeout: Duration::from_millis(100),
        }
    }

    /// Whether this is a Redlock (quorum) configuration.
    pub fn is_redlock(&self) -> bool {
        self.redlock
    }

    /// Behind Sentinel: the name the sentinels know the primary by (the configuration's
    /// nodes are then the sentinels).
    pub fn sentinel_master(&self) -> Option<&str> {
        self.sentinel_master.as_deref()
    }

    /// How many nodes the configuration names (sentinels, behind Sentinel).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// What a backend on this configuration promises, single node or Redlock alike:
    /// notification by pub/sub, batched renewal, millisecond TTLs on the servers' clocks,
    /// fencing counters as durable as the operator says the servers are (and never durable
    /// on servers allowed to evict them). No fair ordering: waiters race.
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_notification: true,
            durable_fencing: self.durable && !self.allow_eviction,
            reentrancy: true,
            liveness: Liveness::Batched,
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(30 * 24 * 60 * 60),
            ttl_granularity: Duration::from_millis(1),
            ..Capabilities::default()
        }
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
        if self.replicas.is_some() && self.replica_timeout >= self.response_timeout {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "replica_timeout {:?} must be below the response time-out {:?}, which \
                     bounds the WAIT's reply",
                    self.replica_timeout, self.response_timeout
                ),
            ));
        }
        if self.redlock && self.replicas.is_some() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "replicas is for one primary with replicas, not Redlock",
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

    /// How to connect to each node, in order.
    pub(crate) fn node_targets(&self) -> Result<Vec<NodeTarget>> {
        self.nodes.iter().map(|node| self.target(node)).collect()
    }

    /// Behind Sentinel, how to ask each sentinel, in order: database 0 and no credentials
    /// (those are the primary's), plain TCP.
    pub(crate) fn sentinel_targets(&self) -> Result<Vec<NodeTarget>> {
        let anonymous = RedisConfig {
            username: None,
            password: None,
            db: 0,
            tls: false,
            ..self.clone()
        };
        self.nodes
            .iter()
            .map(|node| anonymous.target(node))
            .collect()
    }

    /// How to connect to the server at `host:port` (a primary a sentinel named), with this
    /// configuration's credentials and database.
    pub(crate) fn target_at(&self, host: &str, port: u16) -> Result<NodeTarget> {
        self.target(&NodeAddr {
            host: host.to_string(),
            port,
        })
    }

    /// Where to subscribe to release notifications: the `subscriber_url` if set (parsed
    /// like any URL here, with its own credentials), else the single node.
    pub(crate) fn subscriber_target(&self) -> Result<Option<NodeTarget>> {
        let Some(url) = &self.subscriber_url else {
            return Ok(None);
        };
        let other = RedisConfig::from_url(url)?;
        match other.nodes.as_slice() {
            [node] if !other.redlock => other.target(node).map(Some),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                "subscriber_url must name exactly one node (redis:// or rediss://)",
            )),
        }
    }

    fn target(&self, node: &NodeAddr) -> Result<NodeTarget> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: node.host.clone(),
                port: node.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(node.host.clone(), node.port)
        };
        let mut redis = RedisConnectionInfo::default().set_db(self.db);
        if let Some(username) = &self.username {
            redis = redis.set_username(username);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        let shown = format!("{scheme}://{}/{}", node.display(), self.db);
        let info = addr
            .into_connection_info()
            .map_err(|err| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("{shown}: not a valid address"),
                )
                .with_source(err)
            })?
            .set_redis_settings(redis);
        Ok(NodeTarget { shown, info })
    }
}

/// The `replicas` option: a positive number or `all`.
fn take_replicas(url: &mut StoreUrl) -> Result<Option<Replicas>> {
    let Some(value) = url.take_param("replicas") else {
        return Ok(None);
    };
    if value.eq_ignore_ascii_case("all") {
        return Ok(Some(Replicas::AllConnected));
    }
    value
        .parse()
        .map(|count| Some(Replicas::Count(count)))
        .map_err(|_| {
            url.error(&format!(
                "replicas={value:?} is not a positive number or all"
            ))
        })
}

impl NodeAddr {
    /// `host:port`, with brackets around an IPv6 address.
    fn display(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(NodeAddr::display).collect();
        f.debug_struct("RedisConfig")
            .field("nodes", &nodes)
            .field("redlock", &self.redlock)
            .field("sentinel_master", &self.sentinel_master)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("durable", &self.durable)
            .field("allow_eviction", &self.allow_eviction)
            .field("replicas", &self.replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field(
                "subscriber_url",
                &self
                    .subscriber_url
                    .as_deref()
                    .map(lock_core::backend::redact_url),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(targets: &[NodeTarget]) -> Vec<&str> {
        targets.iter().map(|t| t.shown.as_str()).collect()
    }

    #[test]
    fn single_node_with_options() {
        let config = RedisConfig::from_url(
            "redis://u:s3cret@127.0.0.1:7000/2?key_prefix=app:&connect_timeout_ms=100&durable=true",
        )
        .unwrap();
        assert!(!config.is_redlock());
        let targets = config.node_targets().unwrap();
        assert_eq!(shown(&targets), ["redis://127.0.0.1:7000/2"]);
        let redis = targets[0].info.redis_settings();
        assert_eq!(redis.username(), Some("u"));
        assert_eq!(redis.password(), Some("s3cret"));
        assert_eq!(redis.db(), 2);
        assert_eq!(config.key_prefix, "app:");
        assert_eq!(config.connect_timeout, Duration::from_millis(100));
        assert!(config.durable);
        assert!(!config.allow_eviction);
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn redlock_nodes_share_credentials() {
        let config = RedisConfig::from_url(
            "REDIS+REDLOCK://:pw@a:1,b:2,[::1]/0?node_timeout_ms=50&allow_eviction=yes",
        )
        .unwrap();
        assert!(config.is_redlock());
        let targets = config.node_targets().unwrap();
        assert_eq!(
            shown(&targets),
            ["redis://a:1/0", "redis://b:2/0", "redis://[::1]:6379/0"]
        );
        assert!(targets
            .iter()
            .all(|t| t.info.redis_settings().password() == Some("pw")));
        assert_eq!(
            targets[2].info.addr(),
            &ConnectionAddr::Tcp("::1".into(), 6379)
        );
        assert_eq!(config.node_timeout, Duration::from_millis(50));
        assert!(config.allow_eviction);
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let config = RedisConfig::from_url(
            "redis+sentinel://app:s3cret@s1,s2:26380,[::1]:7/cache-primary/3?replicas=1",
        )
        .unwrap();
        assert!(!config.is_redlock());
        assert_eq!(config.sentinel_master(), Some("cache-primary"));
        assert_eq!(config.replicas, Some(Replicas::Count(NonZeroU32::MIN)));
        let sentinels = config.sentinel_targets().unwrap();
        assert_eq!(
            shown(&sentinels),
            [
                "redis://s1:26379/0",
                "redis://s2:26380/0",
                "redis://[::1]:7/0"
            ]
        );
        // The credentials and database are the primary's, not the sentinels'.
        for sentinel in &sentinels {
            let redis = sentinel.info.redis_settings();
            assert_eq!(
                (redis.username(), redis.password(), redis.db()),
                (None, None, 0)
            );
        }
        let primary = config.target_at("10.0.0.5", 6380).unwrap();
        assert_eq!(primary.shown, "redis://10.0.0.5:6380/3");
        let redis = primary.info.redis_settings();
        assert_eq!(
            (redis.username(), redis.password()),
            (Some("app"), Some("s3cret"))
        );
        assert!(!format!("{config:?}").contains("s3cret"));

        let plain = RedisConfig::from_url("redis+sentinel://s1/m").unwrap();
        assert_eq!(plain.sentinel_master(), Some("m"));
        assert_eq!(plain.target_at("h", 1).unwrap().shown, "redis://h:1/0");
        assert_eq!(
            RedisConfig::from_url("redis://h/2")
                .unwrap()
                .sentinel_master(),
            None
        );
    }

    #[test]
    fn bad_sentinel_urls_are_invalid_input() {
        for url in [
            "redis+sentinel://s1",
            "redis+sentinel://s1/",
            "redis+sentinel://s1/m/x",
            "redis+sentinel://s1,s1/m",
            "redis+sentinel://s1/m?node_timeout=1",
            "rediss+sentinel://s1/m",
        ] {
            let err = RedisConfig::from_url(url).unwrap_err();
            assert!(
                matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn reserved_characters_in_credentials_are_percent_decoded() {
        let config = RedisConfig::from_url("redis://us%40er:p%2F%3Fs%23s%40%3A%25@h/0").unwrap();
        let targets = config.node_targets().unwrap();
        let redis = targets[0].info.redis_settings();
        assert_eq!(redis.username(), Some("us@er"));
        assert_eq!(redis.password(), Some("p/?s#s@:%"));
    }

    #[test]
    fn bad_urls_name_the_problem_without_the_password() {
        for (url, needle) in [
            ("http://h", "unsupported scheme"),
            ("redis://h:x", "port"),
            ("redis://h/abc", "database"),
            ("redis://a,b", "redis+redlock"),
            ("redis://h?colour=red", "unknown option"),
            ("redis://h?key_prefix=a{b}", "key_prefix"),
            (
                "redis://u:Qx7Zk9@h?connect_timeout_ms=0",
                "connect_timeout_ms",
            ),
            ("redis://:Qx7/Zk9@h:6379", "percent-encode"),
            ("redis://:Qx7?Zk9@h:6379", "percent-encode"),
            ("redis://:Qx7#Zk9@h:6379/0", "percent-encode"),
            ("redis://:Qx7@Zk9@h", "percent-encode"),
            ("redis+redlock://:Qx7Zk9@a:1,b:2,a:1", "named twice"),
            ("redis://:Qx7Zk9@h?durable=maybe", "durable"),
        ] {
            let err = RedisConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
            assert!(err.message().contains(needle), "{url}: {err}");
            // Neither half of a password split by a reserved character shows.
            for part in ["Qx7", "Zk9"] {
                assert!(!all_text(&err).contains(part), "{url}: {err:?}");
            }
        }
    }

    use conformance_tests::everything_shown as all_text;

    #[test]
    fn replica_confirmation_is_opt_in() {
        let off = RedisConfig::from_url("redis://h").unwrap();
        assert_eq!(off.replicas, None);
        let two = RedisConfig::from_url("redis://h?replicas=2&replica_timeout_ms=40").unwrap();
        assert_eq!(
            two.replicas,
            Some(Replicas::Count(NonZeroU32::new(2).unwrap()))
        );
        assert_eq!(two.replica_timeout, Duration::from_millis(40));
        let all = RedisConfig::from_url("redis://h?replicas=ALL").unwrap();
        assert_eq!(all.replicas, Some(Replicas::AllConnected));
        assert_eq!(all.replica_timeout, Duration::from_millis(100));
    }

    #[test]
    fn bad_replica_options_are_invalid_input() {
        for url in [
            "redis://h?replicas=0",
            "redis://h?replicas=-1",
            "redis://h?replicas=some",
            "redis://h?replicas=",
            "redis://h?replicas=1&replica_timeout_ms=0",
            "redis://h?replicas=1&replica_timeout_ms=soon",
            "redis://h?replica_timeout_ms=50",
            "redis://h?replicas=1&replica_timeout_ms=5000",
            "redis://h?replicas=1&replica_timeout_ms=300&response_timeout_ms=200",
            "redis+redlock://a:1,b:2,c:3?replicas=1",
            "redis+redlock://a:1,b:2,c:3?replicas=all&replica_timeout_ms=10",
        ] {
            let err = RedisConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        }
    }

    /// Generated passwords full of URL-reserved characters: given raw, they are either
    /// refused or parsed, and never shown; given percent-encoded, they reach the Redis
    /// client's connection settings exactly.
    #[test]
    fn generated_passwords_never_show_and_decode_exactly() {
        const ALPHABET: &[char] = &[
            'a', 'Z', '9', '/', '?', '#', '@', ':', '%', '&', '=', '+', ' ', '[', ']', ',', 'é',
            '!', '*', '{',
        ];
        let encode = |text: &str| {
            text.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect::<String>()
        };
        let mut rng = fastrand::Rng::with_seed(0x7ed15);
        for _ in 0..3000 {
            // A fixed marker, so a match is never a short accident.
            let mut password = String::from("Qx8");
            for _ in 0..rng.usize(6..16) {
                password.push(ALPHABET[rng.usize(..ALPHABET.len())]);
            }
            for url in [
                format!("redis://:{password}@127.0.0.1:6379/0"),
                format!("redis+redlock://app:{password}@h1:1,h2:2/0?key_prefix=x"),
                format!("redis://u:{password}@h:6379/1?bogus=1"),
            ] {
                let text = match RedisConfig::from_url(&url) {
                    Ok(config) => format!("{config:?}"),
                    Err(err) => all_text(&err),
                };
                assert!(!text.contains(&password), "{password:?} shown in {text}");
            }
            let url = format!(
                "redis+redlock://app:{}@h1:1,h2:2/0?connect_timeout_ms=x",
                encode(&password)
            );
            let err = RedisConfig::from_url(&url).unwrap_err();
            assert!(!all_text(&err).contains(&password), "{err:?}");
            let url = format!("redis+redlock://app:{}@h1:1,h2:2/0", encode(&password));
            let config = RedisConfig::from_url(&url).unwrap();
            assert!(!format!("{config:?}").contains(&password));
            for target in config.node_targets().unwrap() {
                assert_eq!(
                    target.info.redis_settings().password(),
                    Some(password.as_str())
                );
                assert!(!target.shown.contains(&password));
            }
        }
    }
}
