//! Options of an etcd client, parsed from a URL.

use std::fmt;
use std::time::Duration;

use lock_core::backend::StoreUrl;
use lock_core::{Capabilities, Error, ErrorKind, Liveness, Result};

const DEFAULT_PORT: u16 = 2379;

/// The URL schemes [`EtcdConfig::from_url`] accepts.
pub(crate) const SCHEMES: &[&str] = &["etcd"];

/// How entries of one lock are laid out in etcd.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// `<prefix>/<hex of the key>/<lease id>`: no key can reach another's entries.
    #[default]
    Distlock,
    /// `<prefix><key>/<etcd lease id in hex>`, exactly as etcd's `concurrency.Mutex` (and
    /// so `etcdctl lock`) lays out a lock, so both exclude each other on the same name.
    EtcdMutex,
}

/// How to reach etcd and how to lay out the locks there.
///
/// Parsed from a URL by [`EtcdConfig::from_url`]:
/// `etcd://[user:password@]host1:port1[,host2:port2...][/prefix][?option=value&...]`
/// (the scheme is case-insensitive, the port defaults to 2379). The endpoints are members
/// of one cluster; requests are balanced over them and move on when one fails.
/// A reserved character (`/ ? # @ : %`) in the user name or password must be
/// percent-encoded. User and password are used for etcd's authentication and never shown.
///
/// Options (all optional):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `connect_timeout_ms` | 2000 | bound on each step of connecting: reaching a member, the HTTP/2 handshake, authentication, the member's status |
/// | `request_timeout_ms` | 5000 | bound on one request (the first read of the namespace in `connect` included) |
/// | `min_ttl_ms` | 2000 | the shortest TTL accepted; set it to your cluster's minimum lease TTL (1.5 election timeouts, rounded up to a second) |
/// | `layout` | `distlock` | `etcd-mutex` lays entries out like etcd's own mutex, for `etcdctl lock` interoperability (see the crate docs) |
///
/// The path is the namespace prefix of every key written (default `distlock`).
#[derive(Clone)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    username: Option<String>,
    password: Option<String>,
    /// Namespace of every etcd key this client writes.
    pub prefix: String,
    /// Bound on each step of connecting: reaching a member, the HTTP/2 handshake,
    /// authentication, the member's status.
    pub connect_timeout: Duration,
    /// Bound on one request (the first read of the namespace in
    /// [`connect`](crate::connect) included).
    pub request_timeout: Duration,
    /// The shortest TTL accepted (the cluster's minimum lease TTL).
    pub min_ttl: Duration,
    /// How a lock's entries are laid out.
    pub layout: Layout,
}

impl EtcdConfig {
    /// Parses an `etcd://` URL. A malformed URL or an unknown option is
    /// [`ErrorKind::InvalidInput`] naming the problem (never repeating the password).
    pub fn from_url(url: &str) -> Result<Self> {
        let mut url = StoreUrl::parse(url)?;
        url.expect_scheme(SCHEMES)?;
        let defaults = EtcdConfig::new(Vec::new());
        let layouts = [
            ("distlock", Layout::Distlock),
            ("etcd-mutex", Layout::EtcdMutex),
        ];
        let config = EtcdConfig {
            connect_timeout: url
                .take_millis("connect_timeout_ms")?
                .unwrap_or(defaults.connect_timeout),
            request_timeout: url
                .take_millis("request_timeout_ms")?
                .unwrap_or(defaults.request_timeout),
            min_ttl: url.take_millis("min_ttl_ms")?.unwrap_or(defaults.min_ttl),
            layout: url.take_choice("layout", &layouts)?.unwrap_or_default(),
            prefix: match url.path() {
                "" => defaults.prefix,
                path => path.to_string(),
            },
            endpoints: url
                .hosts()
                .iter()
                .map(|host| host.with_port(DEFAULT_PORT))
                .collect(),
            username: Some(url.username().to_string()).filter(|u| !u.is_empty()),
            password: url.password().map(str::to_string),
        };
        url.finish()?;
        config.validate()?;
        Ok(config)
    }

    /// A configuration for `endpoints` (`host:port`) with every option at its default.
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdConfig {
            endpoints,
            username: None,
            password: None,
            prefix: "distlock".to_string(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            min_ttl: Duration::from_secs(2),
            layout: Layout::Distlock,
        }
    }

    /// The same configuration, authenticating as `user` with `password`.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.username = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// The cluster members, `host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub(crate) fn credentials(&self) -> Option<(&str, &str)> {
        self.username
            .as_deref()
            .map(|user| (user, self.password.as_deref().unwrap_or("")))
    }

    /// What a backend on this configuration promises: a fair queue driven by watches,
    /// revision tokens that survive restarts, leases that live by the client's etcd
    /// leases (whole seconds).
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair_ordering: true,
            native_notification: true,
            durable_fencing: true,
            reentrancy: true,
            liveness: Liveness::Session,
            min_ttl: self.min_ttl,
            // etcd refuses lease TTLs above 9,000,000,000 s; a year is plenty.
            max_ttl: Duration::from_secs(365 * 24 * 60 * 60),
            ttl_granularity: Duration::from_secs(1),
            // The leader starts a lease's TTL when it applies the grant (or a keep-alive),
            // after the request was sent, and runs it out by Go's clock: no hold ends
            // before its TTL. Its expiry check runs every 500 ms, so one can end later.
            clock_step: Duration::ZERO,
            records: true,
            // A lock entry on an etcd lease of its own that nothing keeps alive
            // (`detached.rs`).
            detached_holds: true,
            // Semaphores and reader-writer locks in fair queues of their own (`shared.rs`);
            // the etcd-mutex layout refuses semaphores (`keys.rs`).
            shared_holds: true,
            ..Capabilities::default()
        }
    }

    fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "no etcd endpoint configured",
            ));
        }
        if self.prefix.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the key prefix is empty",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("min_ttl", &self.min_ttl)
            .field("layout", &self.layout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_prefix_and_options() {
        let config = EtcdConfig::from_url(
            "ETCD://u:s%2F3cret@127.0.0.1:7000,h2/app/locks?request_timeout_ms=100&min_ttl_ms=1000",
        )
        .unwrap();
        assert_eq!(config.endpoints(), ["127.0.0.1:7000", "h2:2379"]);
        assert_eq!(config.prefix, "app/locks");
        assert_eq!(config.credentials(), Some(("u", "s/3cret")));
        assert_eq!(config.request_timeout, Duration::from_millis(100));
        assert_eq!(config.capabilities().min_ttl, Duration::from_secs(1));
        assert_eq!(config.layout, Layout::Distlock);
        let shown = format!("{config:?}");
        assert!(!shown.contains("3cret"), "{shown}");
    }

    #[test]
    fn bad_urls_are_refused_without_the_password() {
        for url in [
            "redis://h",
            "etcd://u:pw@h?nope=1",
            "etcd://u:pw@h?layout=zk",
            "etcd://u:pw@h?request_timeout_ms=0",
        ] {
            let err = EtcdConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
            assert!(!err.to_string().contains("pw"), "{err}");
        }
        let mutex = EtcdConfig::from_url("etcd://h?layout=etcd-mutex").unwrap();
        assert_eq!(mutex.layout, Layout::EtcdMutex);
    }
}
