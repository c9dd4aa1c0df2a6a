//! ZooKeeper sessions: one per distinct TTL per client, pooled and kept alive by the
//! core's [`SessionPool`] with our own requests, whose *send* times move the deadlines of
//! the leases the core renews. (A lease renewed by hand lives in the same session but
//! follows a keeper of its own: see `backend.rs`.) What is ZooKeeper's here: a connection
//! whose session timeout is the TTL, and a keep-alive the leader takes part in.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{BoxStream, StreamExt};
use lock_core::backend::{
    async_trait, lock_unpoisoned as lock, with_timeout, PooledSession, SessionKeeper, SessionKind,
    SessionNews, SessionPool, SessionStore,
};
use lock_core::{Error, ErrorKind, Result};
use zookeeper_client::{Client, SessionState};

use crate::config::ZkConfig;
use crate::error::{ends_session, into_error};

/// One ZooKeeper session and what the core knows of it.
#[derive(Debug)]
pub(crate) struct ZkSession {
    /// `None` once closed: dropping the last `Client` closes the session on the server,
    /// which deletes its ephemeral nodes at once.
    client: Mutex<Option<Client>>,
    pub(crate) keeper: SessionKeeper,
    /// The negotiated session timeout, which is the TTL of every lease in the session.
    pub(crate) ttl: Duration,
    /// The server's id of the session (the `ephemeralOwner` of its nodes).
    pub(crate) id: i64,
    /// How often the session is kept alive: every third of the TTL, and at least every
    /// half tick. The leader hears of a session's requests to a follower only when it
    /// pings the follower (every half tick); with a request every half tick, the leader
    /// has heard of one sent no more than a tick before any keep-alive it answered, which
    /// the extra tick of the session's timeout covers.
    keep_alive_every: Duration,
}

impl ZkSession {
    /// The session's client, or `Unavailable` once the session is over.
    pub(crate) fn client(&self) -> Result<Client> {
        lock(&self.client).clone().ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "zookeeper: the session ended; retrying under a new one",
            )
        })
    }

    /// A request sent at `sent_at`, which the leader took part in (a write, or a `sync`
    /// before a read), was answered in this session: the leader counts the session alive
    /// from no earlier than that send, less one tick, and the session's timeout on the
    /// server is one tick longer than its leases' TTL (see [`open_session`]).
    pub(crate) fn proved(&self, sent_at: Instant) {
        self.keeper.kept_alive(sent_at);
    }

    /// Maps a client error of this session, ending the session when the error says the
    /// server did.
    pub(crate) fn failed(&self, err: zookeeper_client::Error, what: &str) -> Error {
        if ends_session(&err) {
            self.end();
        }
        into_error(err, what)
    }

    /// Ends the session: every lease of it is lost at once, and its nodes go with it.
    pub(crate) fn end(&self) {
        self.keeper.expired();
        lock(&self.client).take();
    }
}

impl PooledSession for ZkSession {
    fn keeper(&self) -> &SessionKeeper {
        &self.keeper
    }

    /// New acquisitions may still use the session: it has not ended, and it has not been
    /// silent for longer than its timeout (the server may have ended it).
    fn usable(&self) -> bool {
        let status = self.keeper.status();
        !status.expired
            && lock(&self.client).is_some()
            && !(status.disconnected && status.proven_at + status.ttl <= Instant::now())
    }
}

/// A client's sessions.
#[derive(Debug)]
pub(crate) struct Sessions {
    pool: SessionPool<ZkStore>,
}

impl Sessions {
    pub(crate) fn new(config: ZkConfig) -> Self {
        Sessions {
            pool: SessionPool::new(ZkStore { config }),
        }
    }

    /// The session of leases with `ttl`: the open one, or a new one (a session that ended
    /// is never used again).
    pub(crate) async fn session_for(&self, ttl: Duration) -> Result<Arc<ZkSession>> {
        self.pool.session(SessionKind::Shared(ttl), ttl).await
    }
}

/// ZooKeeper's side of the pool.
#[derive(Debug)]
struct ZkStore {
    config: ZkConfig,
}

#[async_trait]
impl SessionStore for ZkStore {
    type Session = ZkSession;

    fn name(&self) -> &'static str {
        "zookeeper"
    }

    async fn open(&self, _kind: SessionKind, ttl: Duration) -> Result<ZkSession> {
        open_session(&self.config, ttl).await
    }

    /// A `sync`, which the server answers only while it is in contact with the leader (who
    /// alone expires sessions), then a read, answered only for a live session. A read
    /// alone would be answered by a follower cut off from the leader, for as long as the
    /// follower takes to notice (`syncLimit × tickTime`), while the leader counts the
    /// session down.
    async fn keep_alive(&self, session: &ZkSession) -> SessionNews {
        let Ok(client) = session.client() else {
            return SessionNews::Ended;
        };
        // The client sends a request when it is made: both go out now, in this order, and
        // the server answers a session's requests in order.
        let sync = client.sync("/");
        let read = client.check_stat("/");
        let proof = async {
            let answered = async {
                sync.await?;
                read.await
            };
            Ok(answered.await)
        };
        match with_timeout("zookeeper", session.ttl, "a keep-alive", proof).await {
            Ok(Ok(_)) => SessionNews::Alive,
            Ok(Err(err)) if ends_session(&err) => SessionNews::Ended,
            _ => SessionNews::Unanswered,
        }
    }

    fn keep_alive_every(&self, session: &ZkSession) -> Duration {
        session.keep_alive_every
    }

    /// The client's connection state: a lost connection, or the end of the session.
    fn news(&self, session: &ZkSession) -> BoxStream<'static, SessionNews> {
        let Ok(client) = session.client() else {
            return futures_util::stream::once(async { SessionNews::Ended }).boxed();
        };
        futures_util::stream::unfold(client.state_watcher(), |mut state| async move {
            let news = match state.changed().await {
                SessionState::Disconnected => SessionNews::Unanswered,
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => SessionNews::Alive,
                _ => SessionNews::Ended,
            };
            Some((news, state))
        })
        .boxed()
    }

    fn end(&self, session: &ZkSession) {
        session.end();
    }
}

/// Connects a new session for leases of `ttl`.
///
/// The session's timeout on the server is `ttl` plus one tick (`tick_ms`). In an ensemble
/// the leader alone expires sessions, and it hears of a session's requests to a follower
/// only at its next ping of that follower (every half tick), so it may count the session
/// from up to that much before the send of an answered request; it also buckets expiry
/// times by tick. The extra tick on the server keeps the local deadline (send + `ttl` −
/// drift) before the leader's expiry.
pub(crate) async fn open_session(config: &ZkConfig, ttl: Duration) -> Result<ZkSession> {
    if !ttl.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("zookeeper: session timeouts are whole milliseconds; the TTL {ttl:?} is not"),
        ));
    }
    let timeout = ttl.saturating_add(config.tick());
    let sent_at = Instant::now();
    let client = connect(config, timeout).await?;
    if client.session_timeout() != timeout {
        return Err(Error::misconfigured(format!(
            "zookeeper: the server granted a session timeout of {:?} where {timeout:?} was asked \
             (the TTL {ttl:?} plus one tick); set min_ttl_ms and max_ttl_ms to the server's \
             minSessionTimeout and maxSessionTimeout, and tick_ms to its tickTime",
            client.session_timeout()
        )));
    }
    Ok(ZkSession {
        keeper: SessionKeeper::new(sent_at, ttl),
        ttl,
        keep_alive_every: (ttl / 3).min(config.tick() / 2),
        id: client.session_id().0,
        client: Mutex::new(Some(client)),
    })
}

/// A client with session timeout `timeout`, authenticated with the configured credential.
pub(crate) async fn connect(config: &ZkConfig, timeout: Duration) -> Result<Client> {
    let mut connector = Client::connector()
        .with_session_timeout(timeout)
        .with_fail_eagerly();
    if let Some((user, password)) = config.credentials() {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    let connect_string = config.connect_string();
    let connecting = async {
        connector
            .connect(&connect_string)
            .await
            .map_err(|err| into_error(err, "connecting"))
    };
    with_timeout(
        "zookeeper",
        config.connect_timeout,
        "the session request",
        connecting,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ttl_with_a_fraction_of_a_millisecond_is_invalid_input() {
        // Refused before any connection is tried: nothing listens on port 1.
        let config = ZkConfig::from_url("zk://127.0.0.1:1?min_ttl_ms=200&connect_timeout_ms=50")
            .expect("a valid URL");
        let err = open_session(&config, Duration::from_micros(1_000_500))
            .await
            .expect_err("a sub-millisecond TTL");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let err = open_session(&config, Duration::from_millis(1000))
            .await
            .expect_err("nothing listens");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }
}
