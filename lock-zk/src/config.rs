//! Options of a ZooKeeper client, parsed from a URL.

use std::fmt;
use std::time::Duration;

use lock_core::backend::StoreUrl;
use lock_core::{Error, Result};

use crate::keys::Layout;

const DEFAULT_PORT: u16 = 2181;

/// The URL schemes [`ZkConfig::from_url`] accepts.
pub(crate) const SCHEMES: &[&str] = &["zk"];

/// How to reach ZooKeeper and where to keep the locks.
///
/// Parsed from a URL by [`ZkConfig::from_url`]:
/// `zk://[user:password@]host:port[,host:port...][/chroot][?option=value&...]`.
/// A user name and password are sent as a `digest` credential, and nodes are then created
/// with the `creator_all` ACL; they never appear in `Debug` output or error messages.
///
/// | option | default | meaning |
/// |---|---|---|
/// | `session_timeout_ms` | 10000 | session timeout of the client's control session (lookups, releases, watches) |
/// | `connect_timeout_ms` | 2000 | bound on establishing a session |
/// | `min_ttl_ms` | 4000 | the server's `minSessionTimeout` (ZooKeeper's default is 2 ticks) |
/// | `max_ttl_ms` | 40000 | the server's `maxSessionTimeout` (ZooKeeper's default is 20 ticks) |
/// | `tick_ms` | half of `min_ttl_ms` | the server's `tickTime` (a larger value is safe, a smaller one is not); every session's timeout on the server is its TTL plus one tick |
/// | `root` | `/distlock` | parent of the per-key nodes (`layout=distlock`) |
/// | `layout` | `distlock` | `curator`: the key is the lock path, shared with Curator and kazoo |
///
/// A lease's TTL is the timeout of the session its node lives in, so TTLs are limited to
/// what the server grants: set `min_ttl_ms`/`max_ttl_ms` to the server's settings (a
/// session the server negotiates to another timeout is refused as `Misconfigured`).
///
/// In an ensemble the leader alone expires sessions, and it hears of a session's requests
/// to a follower only at its next ping of that follower (every half tick); its expiry is
/// also counted in whole ticks. So each session asks the server for a timeout one
/// `tickTime` longer than its leases' TTL (the longest TTL is `max_ttl_ms` less one
/// tick). The default, half of `min_ttl_ms`, is the largest tick a server with
/// ZooKeeper's default `minSessionTimeout` (2 ticks) can have; set `tick_ms` to the
/// server's `tickTime` so that a dead holder's lock is freed sooner.
#[derive(Clone)]
pub struct ZkConfig {
    hosts: Vec<String>,
    chroot: String,
    credentials: Option<(String, String)>,
    /// Timeout of the control session, used for inspecting, releasing and watching.
    pub session_timeout: Duration,
    /// Bound on establishing a session.
    pub connect_timeout: Duration,
    /// The shortest TTL: the server's `minSessionTimeout`.
    pub min_ttl: Duration,
    /// The longest TTL: the server's `maxSessionTimeout`.
    pub max_ttl: Duration,
    /// The server's `tickTime` (or more); `None` for half of [`min_ttl`](Self::min_ttl).
    /// See [`tick`](Self::tick).
    pub tick_time: Option<Duration>,
    /// Parent of the per-key lock nodes in the [`Layout::Distlock`] layout.
    pub root: String,
    /// Where the lock nodes of each key live.
    pub layout: Layout,
}

impl ZkConfig {
    /// Parses a `zk://` URL. A malformed URL or an unknown option is
    /// [`ErrorKind::InvalidInput`](lock_core::ErrorKind::InvalidInput), never repeating the
    /// password.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut url = StoreUrl::parse(url)?;
        url.expect_scheme(SCHEMES)?;
        let credentials = match (url.username(), url.password()) {
            ("", None) => None,
            (user, Some(password)) if !user.is_empty() => {
                Some((user.to_string(), password.to_string()))
            }
            _ => return Err(url.error("a digest credential needs both a user name and a password")),
        };
        let defaults = ZkConfig::new(Vec::new());
        let layouts = [("distlock", Layout::Distlock), ("curator", Layout::Curator)];
        let config = ZkConfig {
            session_timeout: url
                .take_millis("session_timeout_ms")?
                .unwrap_or(defaults.session_timeout),
            connect_timeout: url
                .take_millis("connect_timeout_ms")?
                .unwrap_or(defaults.connect_timeout),
            min_ttl: url.take_millis("min_ttl_ms")?.unwrap_or(defaults.min_ttl),
            max_ttl: url.take_millis("max_ttl_ms")?.unwrap_or(defaults.max_ttl),
            tick_time: url.take_millis("tick_ms")?,
            root: url.take_param("root").unwrap_or(defaults.root),
            layout: url
                .take_choice("layout", &layouts)?
                .unwrap_or(defaults.layout),
            hosts: url
                .hosts()
                .iter()
                .map(|h| h.with_port(DEFAULT_PORT))
                .collect(),
            chroot: match url.path().trim_end_matches('/') {
                "" => String::new(),
                path => format!("/{path}"),
            },
            credentials,
        };
        url.finish()?;
        config.validate()?;
        Ok(config)
    }

    /// A configuration for `hosts` (`host:port` each) with every option at its default.
    pub fn new(hosts: Vec<String>) -> Self {
        ZkConfig {
            hosts,
            chroot: String::new(),
            credentials: None,
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            min_ttl: Duration::from_secs(4),
            max_ttl: Duration::from_secs(40),
            tick_time: None,
            root: "/distlock".to_string(),
            layout: Layout::Distlock,
        }
    }

    /// The same configuration with a `digest` credential.
    pub fn with_credentials(mut self, user: &str, password: &str) -> Self {
        self.credentials = Some((user.to_string(), password.to_string()));
        self
    }

    /// The same configuration under `chroot` (an absolute path, or empty for none).
    pub fn with_chroot(mut self, chroot: &str) -> Self {
        self.chroot = chroot.trim_end_matches('/').to_string();
        self
    }

    /// Refuses settings that cannot work, with `InvalidInput`.
    pub fn validate(&self) -> Result<()> {
        if self.hosts.is_empty() {
            return Err(Error::new(
                lock_core::ErrorKind::InvalidInput,
                "no ZooKeeper host",
            ));
        }
        if self.min_ttl > self.max_ttl {
            return Err(Error::new(
                lock_core::ErrorKind::InvalidInput,
                "min_ttl_ms is above max_ttl_ms",
            ));
        }
        if self.tick() >= self.min_ttl {
            return Err(Error::new(
                lock_core::ErrorKind::InvalidInput,
                "tick_ms must be below min_ttl_ms (ZooKeeper's minSessionTimeout is 2 ticks \
                 unless set otherwise)",
            ));
        }
        if self.min_ttl.saturating_add(self.tick()) > self.max_ttl {
            return Err(Error::new(
                lock_core::ErrorKind::InvalidInput,
                "min_ttl_ms plus tick_ms is above max_ttl_ms: a session's timeout is its TTL \
                 plus one tick",
            ));
        }
        for (name, path) in [
            ("chroot", self.chroot.as_str()),
            ("root", self.root.as_str()),
        ] {
            if path.is_empty() && name == "chroot" {
                continue;
            }
            crate::keys::check_path(path).map_err(|why| {
                Error::new(
                    lock_core::ErrorKind::InvalidInput,
                    format!("{name} {path:?} is not a ZooKeeper path: {why}"),
                )
            })?;
        }
        Ok(())
    }

    /// The tick added to every session's timeout on the server:
    /// [`tick_time`](Self::tick_time), or half of [`min_ttl`](Self::min_ttl) when unset.
    pub fn tick(&self) -> Duration {
        self.tick_time.unwrap_or(self.min_ttl / 2)
    }

    /// The connect string for the client: hosts and chroot, no credentials.
    pub(crate) fn connect_string(&self) -> String {
        format!("{}{}", self.hosts.join(","), self.chroot)
    }

    pub(crate) fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.as_str()))
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("min_ttl", &self.min_ttl)
            .field("max_ttl", &self.max_ttl)
            .field("tick_time", &self.tick_time)
            .field("root", &self.root)
            .field("layout", &self.layout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_credentials_and_options() {
        let config = ZkConfig::from_url(
            "zk://app:s%2Fcret@h1:2181,h2/apps/x?session_timeout_ms=3000&layout=curator&min_ttl_ms=200",
        )
        .unwrap();
        assert_eq!(config.connect_string(), "h1:2181,h2:2181/apps/x");
        assert_eq!(config.credentials(), Some(("app", "s/cret")));
        assert_eq!(config.session_timeout, Duration::from_millis(3000));
        assert_eq!(config.min_ttl, Duration::from_millis(200));
        assert_eq!(config.layout, Layout::Curator);
        assert_eq!(config.tick(), Duration::from_millis(100));
        assert!(!format!("{config:?}").contains("cret"));
        let ticked = ZkConfig::from_url("zk://h?tick_ms=2000").unwrap();
        assert_eq!(ticked.tick(), Duration::from_millis(2000));
    }

    #[test]
    fn refuses_bad_urls_without_showing_the_password() {
        for url in [
            "redis://h:1",
            "zk://h:1?nope=1",
            "zk://h:1?layout=other",
            "zk://h:1?min_ttl_ms=0",
            "zk://h:1?min_ttl_ms=9000&max_ttl_ms=100",
            "zk://h:1?tick_ms=0",
            "zk://h:1?tick_ms=4000",
            "zk://h:1?min_ttl_ms=200&tick_ms=200",
            "zk://h:1?min_ttl_ms=200&max_ttl_ms=250&tick_ms=100",
            "zk://u:secret@h:1?root=no-slash",
        ] {
            let err = ZkConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), lock_core::ErrorKind::InvalidInput, "{url}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }
}
