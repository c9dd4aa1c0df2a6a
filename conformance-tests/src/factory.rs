//! The suite factory of every store that runs as servers: a backend's test support is the
//! data of one [`ServerStore`] (how to start its servers, how to address them, how to
//! connect), and [`ServerFactory`] does the rest: clients, links through fault proxies,
//! unreachable clients, and private servers that the outage scenarios pause, kill and
//! restart without disturbing the scenarios that share the factory's own servers.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lock_core::backend::{async_trait, DynBackend, LockBackend};
use tokio::sync::Mutex;

use crate::failure::Failure;
use crate::network::closed_addr;
use crate::proxy::LinkControl;
use crate::proxy::TcpFaultProxy;
use crate::store_process::StoreProcess;

/// A boxed future that owns what it uses.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A count of requests, or why it could not be read.
pub type CountResult = Result<u64, String>;

/// [`ServerStore::enable_auth`]: given the servers' addresses, a URL with the right
/// password, or why authentication could not be switched on.
pub type EnableAuth = fn(Vec<SocketAddr>) -> BoxFuture<Result<String, String>>;

/// [`BackendFactory::shortest_ttl`] unless a store needs more.
pub const DEFAULT_SHORTEST_TTL: Duration = Duration::from_millis(400);

/// Builds clients of one store under test. Each [`connect`](Self::connect) is an
/// independent client, as a separate process would have.
#[async_trait]
pub trait BackendFactory: Send + Sync + 'static {
    /// The name in test names and the report (`memory`, `redis`, `postgres`, ...).
    fn name(&self) -> String;

    /// A new, independent client of the store.
    async fn connect(&self) -> lock_core::Result<DynBackend>;

    /// What the store still keeps for keys that start with `prefix`, apart from what the
    /// backend's docs say it keeps for ever (such as a fencing counter). Empty when
    /// nothing is left behind. The default asks a new client for its
    /// [`stored_keys`](lock_core::backend::LockBackend::stored_keys).
    async fn residue(&self, prefix: &str) -> lock_core::Result<Vec<String>> {
        self.connect().await?.stored_keys(prefix).await
    }

    /// A client configured for a store that cannot be reached (a closed port), if the
    /// backend talks to a server at all; `None` for an embedded store.
    async fn connect_unreachable(&self) -> Option<lock_core::Result<DynBackend>> {
        None
    }

    /// A new client whose link to the store the scenario can cut or slow, for the session
    /// scenarios; `None` when the factory cannot build one.
    async fn connect_with_link(
        &self,
    ) -> Option<lock_core::Result<(DynBackend, Arc<dyn LinkControl>)>> {
        None
    }

    /// The shortest TTL the scenarios may give a lease of this store: long enough that a
    /// renewal sent a third of the way in is answered before the lease runs out, on a
    /// loaded machine too. A store that syncs every write to disk needs more than one that
    /// keeps them in memory.
    fn shortest_ttl(&self) -> Duration {
        DEFAULT_SHORTEST_TTL
    }

    /// Key names the store is known to treat specially (metacharacters of its query
    /// language or pattern matching, reserved or path-like names): the hostile-key
    /// scenario holds each under the run's prefix, beside names every store gets.
    fn hostile_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether [`counted_store`](Self::counted_store) gives a store; by default, whether
    /// the factory's servers count renewal requests
    /// ([`ServerStore::renewal_requests`]). A factory overriding one overrides both.
    fn counts_renewal_requests(&self) -> bool {
        self.servers()
            .is_some_and(|servers| servers.store().renewal_requests.is_some())
    }

    /// A store for one scenario alone whose requests that can renew leases are counted
    /// (to show that renewals are batched), if the factory can count them; by default,
    /// private servers counted by [`ServerStore::renewal_requests`].
    async fn counted_store(&self) -> Option<Result<Box<dyn CountedStore>, Failure>> {
        let servers = self.servers()?;
        let count = servers.store().renewal_requests?;
        Some(match servers.start_private().await {
            Ok(servers) => Ok(Box::new(CountedServers { servers, count })),
            Err(failure) => Err(failure),
        })
    }

    /// The servers behind the factory, for the outage scenarios (private servers to pause,
    /// kill and restart, clients of other addresses); `None` for an embedded store.
    fn servers(&self) -> Option<&ServerFactory> {
        None
    }

    /// A way to end a holder's session from the store's side while its link is healthy
    /// (etcd revoking its lease), for the scenario of `LossReason::SessionEnded`; `None`
    /// when the store has no sessions or the factory cannot end one from outside.
    fn session_ender(&self) -> Option<Arc<dyn SessionEnder>> {
        None
    }

    /// A URL by which another process reaches the same store (a lock it takes there
    /// excludes this factory's clients), for the scenarios that kill a holder process;
    /// `None` for a store that lives inside this process.
    fn process_url(&self) -> Option<String> {
        None
    }
}

/// Ends store sessions from the store's side: see [`BackendFactory::session_ender`].
#[async_trait]
pub trait SessionEnder: Send + Sync {
    /// Ends the session that keeps the current holder of `key` (a user key) alive, as the
    /// store ends a session it has given up on; the holder's link stays healthy.
    async fn end_session_holding(&self, key: &str) -> lock_core::Result<()>;
}

/// How a server store ends the session holding a key (URL of its servers, user key).
pub type EndSession = fn(String, String) -> BoxFuture<lock_core::Result<()>>;

/// What the suite must know of a store that runs as servers.
#[derive(Clone, Copy)]
pub struct ServerStore {
    /// The name in test names and the report.
    pub name: &'static str,
    /// Starts a fresh set of servers (one, or a cluster's members), ready to serve; a
    /// server that fails to start is an error, never a skip.
    pub start: fn() -> BoxFuture<Result<Vec<StoreProcess>, String>>,
    /// A URL over these server addresses with extra options (`"a=b&c=d"`, may be empty).
    pub url: fn(&[SocketAddr], &str) -> String,
    /// Connects a backend for a URL.
    pub connect: fn(String) -> BoxFuture<lock_core::Result<DynBackend>>,
    /// Builds a backend for a URL without contacting the store, when the backend can:
    /// lock calls, not the connect, then meet a store that is gone.
    pub connect_lazily: Option<fn(String) -> lock_core::Result<DynBackend>>,
    /// Options of clients whose link the scenarios control (`""` for none).
    pub link_options: &'static str,
    /// Options of clients of unreachable stores besides the connect time-out the scenario
    /// sets (`""` for none).
    pub unreachable_options: &'static str,
    /// A URL naming a user the servers know with this wrong password, when the servers
    /// authenticate clients.
    pub wrong_password: Option<fn(&[SocketAddr], &str) -> String>,
    /// For a store whose authentication is a switch of the whole server, off at the
    /// factory's servers: switches it on at fresh private servers (at these addresses), so
    /// that they know the user [`wrong_password`](Self::wrong_password) names and refuse
    /// clients without credentials, and gives a URL with that user's right password.
    /// `None` when the factory's own servers authenticate already.
    pub enable_auth: Option<EnableAuth>,
    /// How many requests that can renew leases the server at an address has received so
    /// far, when the store can tell (to show that renewals are batched).
    pub renewal_requests: Option<fn(SocketAddr) -> BoxFuture<CountResult>>,
    /// [`BackendFactory::shortest_ttl`] for this store.
    pub shortest_ttl: Duration,
    /// Ends the session holding a key from the store's side, when the store has sessions
    /// and a way to end one from outside ([`BackendFactory::session_ender`]).
    pub end_session: Option<EndSession>,
    /// [`BackendFactory::hostile_keys`] for this store.
    pub hostile_keys: &'static [&'static str],
}

/// A store of one scenario's own whose requests are counted
/// ([`BackendFactory::counted_store`]), kept as long as the value.
#[async_trait]
pub trait CountedStore: Send + Sync {
    /// A new client of the store.
    async fn connect(&self) -> lock_core::Result<DynBackend>;

    /// How many requests that can renew leases each of the store's servers (or its one
    /// embedded database) has received so far, in the same order at every call.
    async fn renewal_requests(&self) -> Result<Vec<u64>, String>;
}

/// Private servers counted by their store's [`ServerStore::renewal_requests`].
struct CountedServers {
    servers: PrivateServers,
    count: fn(SocketAddr) -> BoxFuture<CountResult>,
}

#[async_trait]
impl CountedStore for CountedServers {
    async fn connect(&self) -> lock_core::Result<DynBackend> {
        self.servers.connect("").await
    }

    async fn renewal_requests(&self) -> Result<Vec<u64>, String> {
        let mut counts = Vec::with_capacity(self.servers.addrs().len());
        for addr in self.servers.addrs() {
            counts.push((self.count)(*addr).await?);
        }
        Ok(counts)
    }
}

/// Clients of servers started for the run, kept alive as long as the factory.
pub struct ServerFactory {
    store: ServerStore,
    addrs: Vec<SocketAddr>,
    _servers: Vec<StoreProcess>,
}

impl ServerFactory {
    /// Starts the store's servers and makes a factory over them.
    pub async fn start(store: ServerStore) -> Result<Arc<dyn BackendFactory>, String> {
        let servers = (store.start)()
            .await
            .map_err(|err| format!("starting {}: {err}", store.name))?;
        Ok(Arc::new(ServerFactory {
            store,
            addrs: servers.iter().map(StoreProcess::addr).collect(),
            _servers: servers,
        }))
    }

    /// The store.
    pub fn store(&self) -> &ServerStore {
        &self.store
    }

    /// The servers' addresses.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A backend for these addresses (other than the servers': proxies, closed ports) with
    /// extra options.
    pub async fn connect_to(
        &self,
        addrs: &[SocketAddr],
        options: &str,
    ) -> lock_core::Result<DynBackend> {
        (self.store.connect)((self.store.url)(addrs, options)).await
    }

    /// A fresh set of servers of the same kind for one scenario alone, to pause, kill and
    /// restart while other scenarios use the factory's own servers.
    pub async fn start_private(&self) -> Result<PrivateServers, Failure> {
        let servers = (self.store.start)()
            .await
            .map_err(|err| Failure(format!("starting private {}: {err}", self.store.name)))?;
        Ok(PrivateServers {
            store: self.store,
            addrs: servers.iter().map(StoreProcess::addr).collect(),
            servers: Mutex::new(servers),
        })
    }
}

#[async_trait]
impl BackendFactory for ServerFactory {
    fn name(&self) -> String {
        self.store.name.to_string()
    }

    fn shortest_ttl(&self) -> Duration {
        self.store.shortest_ttl
    }

    fn hostile_keys(&self) -> &'static [&'static str] {
        self.store.hostile_keys
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        self.connect_to(&self.addrs, "").await
    }

    async fn connect_unreachable(&self) -> Option<lock_core::Result<DynBackend>> {
        let closed: Result<Vec<SocketAddr>, Failure> =
            self.addrs.iter().map(|_| closed_addr()).collect();
        let closed = match closed {
            Ok(closed) => closed,
            Err(failure) => return Some(Err(internal(failure.0))),
        };
        let url = (self.store.url)(
            &closed,
            &join_options("connect_timeout_ms=300", self.store.unreachable_options),
        );
        Some(match self.store.connect_lazily {
            Some(build) => build(url),
            None => (self.store.connect)(url).await,
        })
    }

    async fn connect_with_link(
        &self,
    ) -> Option<lock_core::Result<(DynBackend, Arc<dyn LinkControl>)>> {
        // A proxy in front of every server: the client cannot route around the cut.
        let mut proxies = Vec::with_capacity(self.addrs.len());
        for addr in &self.addrs {
            match TcpFaultProxy::start(*addr).await {
                Ok(proxy) => proxies.push(proxy),
                Err(err) => return Some(Err(internal(format!("cannot start a proxy: {err}")))),
            }
        }
        let proxied: Vec<SocketAddr> = proxies.iter().map(TcpFaultProxy::addr).collect();
        Some(
            self.connect_to(&proxied, self.store.link_options)
                .await
                .map(|backend| (backend, Arc::new(proxies) as Arc<dyn LinkControl>)),
        )
    }

    fn servers(&self) -> Option<&ServerFactory> {
        Some(self)
    }

    fn process_url(&self) -> Option<String> {
        Some((self.store.url)(&self.addrs, ""))
    }

    fn session_ender(&self) -> Option<Arc<dyn SessionEnder>> {
        let end = self.store.end_session?;
        Some(Arc::new(ServerSessionEnder {
            end,
            url: (self.store.url)(&self.addrs, ""),
        }))
    }
}

/// A server store's [`EndSession`], over the factory's servers.
struct ServerSessionEnder {
    end: EndSession,
    url: String,
}

#[async_trait]
impl SessionEnder for ServerSessionEnder {
    async fn end_session_holding(&self, key: &str) -> lock_core::Result<()> {
        (self.end)(self.url.clone(), key.to_string()).await
    }
}

/// Servers started for one scenario, stopped when dropped.
pub struct PrivateServers {
    store: ServerStore,
    addrs: Vec<SocketAddr>,
    servers: Mutex<Vec<StoreProcess>>,
}

impl PrivateServers {
    /// The servers' addresses.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A new client of every server, with extra URL options.
    pub async fn connect(&self, options: &str) -> lock_core::Result<DynBackend> {
        (self.store.connect)((self.store.url)(&self.addrs, options)).await
    }

    /// Freezes every server (SIGSTOP): connections stay open, nothing is answered.
    pub async fn pause(&self) -> Result<(), Failure> {
        for server in self.servers.lock().await.iter() {
            server
                .pause()
                .map_err(|err| Failure(format!("pausing a server: {err}")))?;
        }
        Ok(())
    }

    /// Lets every server run again (SIGCONT).
    pub async fn resume(&self) -> Result<(), Failure> {
        for server in self.servers.lock().await.iter() {
            server
                .resume()
                .map_err(|err| Failure(format!("resuming a server: {err}")))?;
        }
        Ok(())
    }

    /// Kills every server without warning (SIGKILL), then starts them all again on the
    /// same ports and data, together (a cluster member is ready only once a quorum is).
    pub async fn restart(&self) -> Result<(), Failure> {
        let mut servers = self.servers.lock().await;
        for server in servers.iter_mut() {
            server
                .kill()
                .map_err(|err| Failure(format!("killing a server: {err}")))?;
        }
        let mut restarts = tokio::task::JoinSet::new();
        for (index, mut server) in servers.drain(..).enumerate() {
            restarts.spawn(async move {
                let restarted = server.restart().await;
                (index, server, restarted)
            });
        }
        let mut back = Vec::new();
        let mut failed = None;
        while let Some(done) = restarts.join_next().await {
            let (index, server, restarted) =
                done.map_err(|err| Failure(format!("a restart panicked: {err}")))?;
            if let Err(err) = restarted {
                failed = Some(Failure(format!("restarting a server: {err}")));
            }
            back.push((index, server));
        }
        back.sort_by_key(|(index, _)| *index);
        servers.extend(back.into_iter().map(|(_, server)| server));
        failed.map_or(Ok(()), Err)
    }
}

/// `first` and `second` joined as URL options, either may be empty.
pub fn join_options(first: &str, second: &str) -> String {
    match (first.is_empty(), second.is_empty()) {
        (_, true) => first.to_string(),
        (true, false) => second.to_string(),
        (false, false) => format!("{first}&{second}"),
    }
}

fn internal(message: String) -> lock_core::Error {
    lock_core::Error::new(lock_core::ErrorKind::Internal, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::Offers;

    /// A store whose "servers" are one in-memory store: enough to probe a factory.
    const MEMORY: ServerStore = ServerStore {
        name: "memory-as-server",
        start: || Box::pin(async { Ok(Vec::new()) }),
        url: |_, _| String::new(),
        connect: |_| {
            Box::pin(async { Ok(Arc::new(lock_core::MemoryBackend::new().client()) as DynBackend) })
        },
        connect_lazily: None,
        link_options: "",
        unreachable_options: "",
        wrong_password: None,
        enable_auth: None,
        renewal_requests: None,
        shortest_ttl: DEFAULT_SHORTEST_TTL,
        end_session: None,
        hostile_keys: &[],
    };

    /// A link proxy that cannot start (here: the proxy refuses a target off loopback)
    /// fails the probe, and so the run, instead of marking the link scenarios "not
    /// applicable".
    #[tokio::test]
    async fn a_proxy_that_fails_to_start_fails_the_probe() {
        let factory = ServerFactory {
            store: MEMORY,
            addrs: vec![SocketAddr::from(([192, 0, 2, 1], 1))],
            _servers: Vec::new(),
        };
        let probed = Offers::probe(&factory).await;
        assert!(
            probed.is_err(),
            "probed as {:?}",
            probed.map(|offers| offers.link)
        );
    }
}
