//! A TCP proxy that injects network faults between a lock client and a real store.
//!
//! Partition scenarios need the store to keep running while the client's view of it breaks
//! in a specific way: slow links, silent links, torn connections, or requests that arrive
//! while their replies do not. Point the client at [`TcpFaultProxy::addr`] instead of the
//! store and switch [`ProxyMode`] while the scenario runs; the switch reaches open
//! connections at once, not only new ones.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

/// What the proxy does with traffic. A change applies to open connections immediately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes both ways unchanged.
    Pass,
    /// Forward both ways, holding each chunk back for this long in each direction, so a
    /// request/reply round trip takes at least twice the delay.
    Delay(Duration),
    /// A silent partition: connections stay open but every byte read in either direction is
    /// discarded (never delivered later), and end-of-stream is not passed on either. A
    /// connection accepted during a black hole is not connected to the store until the mode
    /// changes, so its client hangs until its own timeout.
    BlackHole,
    /// Abort every open connection with a TCP reset (both the client and the store side) and
    /// reset new connections as soon as they are accepted.
    Reset,
    /// Forward requests to the store but discard its replies: the store applies the request
    /// while the client never learns that it did.
    CutReplies,
}

/// Which way a chunk travels, so a mode can treat requests and replies differently.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToStore,
    ToClient,
}

impl ProxyMode {
    fn forwards(self, direction: Direction) -> bool {
        match self {
            ProxyMode::Pass | ProxyMode::Delay(_) => true,
            ProxyMode::CutReplies => direction == Direction::ToStore,
            ProxyMode::BlackHole | ProxyMode::Reset => false,
        }
    }
}

/// A fault-injecting TCP proxy listening on a free 127.0.0.1 port.
///
/// Dropping it aborts the listener and every connection task; [`TcpFaultProxy::shutdown`]
/// does the same and waits until all proxied sockets are closed.
#[derive(Debug)]
pub struct TcpFaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    open: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    accept_task: JoinHandle<()>,
}

impl TcpFaultProxy {
    /// Starts a proxy in [`ProxyMode::Pass`] that forwards to `target`.
    ///
    /// `target` must be a loopback address: the proxy exists to sit in front of a store
    /// started by the test itself, and refusing anything else keeps a misconfigured test from
    /// hammering a real host.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        if !target.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TcpFaultProxy only forwards to loopback addresses, not {target}"),
            ));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(ProxyMode::Pass);
        let open = Arc::new(AtomicUsize::new(0));
        let (stop, stop_rx) = oneshot::channel();
        let accept_task = tokio::spawn(accept_loop(
            listener,
            target,
            mode_rx,
            Arc::clone(&open),
            stop_rx,
        ));
        tracing::debug!(%addr, %target, "fault proxy started");
        Ok(Self {
            addr,
            target,
            mode,
            open,
            stop: Some(stop),
            accept_task,
        })
    }

    /// The address clients should connect to instead of the store.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The store address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Switches the fault mode for open and future connections.
    pub fn set_mode(&self, mode: ProxyMode) {
        tracing::debug!(addr = %self.addr, ?mode, "fault proxy mode changed");
        self.mode.send_replace(mode);
    }

    /// The current fault mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// How many client connections the proxy currently holds open, including ones parked in a
    /// black hole that have no store connection yet.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every proxied connection, returning once all are closed.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The accept loop only ends early if it panicked; then there is nothing to stop.
            let _ = stop.send(());
        }
        // A panic in the accept loop has already been reported by the runtime.
        let _ = (&mut self.accept_task).await;
    }
}

impl Drop for TcpFaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.accept_task.abort();
    }
}

/// Counts a connection as open for exactly as long as its task exists, aborted or not.
struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(open))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    open: Arc<AtomicUsize>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let guard = OpenGuard::new(&open);
                    connections.spawn(proxy_connection(client, target, mode.clone(), guard));
                }
                Err(error) => {
                    // Accept errors (e.g. out of file descriptors) are transient; back off
                    // briefly instead of spinning on them.
                    tracing::warn!(%error, "fault proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

async fn proxy_connection(
    mut client: TcpStream,
    target: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    _open: OpenGuard,
) {
    // Bytes that arrive just as a black hole lifts belong to the healed link.
    let mut pending = Vec::new();
    let mut store = loop {
        // Copy the mode out: holding the watch borrow across an await would block set_mode.
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Reset => return reset_on_close(&client),
            ProxyMode::BlackHole => {}
            _ => match TcpStream::connect(target).await {
                Ok(store) => break store,
                Err(error) => {
                    tracing::debug!(%error, %target, "fault proxy could not reach the store");
                    return;
                }
            },
        }
        // Parked in a black hole: swallow what the client sends until the mode changes.
        let mut buf = [0u8; 4096];
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { return },
            read = client.read(&mut buf) => match read {
                Ok(n) if n > 0 => if *mode.borrow() != ProxyMode::BlackHole {
                    pending.extend_from_slice(&buf[..n]);
                },
                _ => return,
            },
        }
    };
    if store.write_all(&pending).await.is_err() {
        return;
    }
    // Latency is the fault under test; Nagle's algorithm would add its own.
    let _ = client.set_nodelay(true);
    let _ = store.set_nodelay(true);

    let reset = {
        let (client_read, client_write) = client.split();
        let (store_read, store_write) = store.split();
        let mut reset_signal = mode.clone();
        tokio::select! {
            reset = reset_signal.wait_for(|m| *m == ProxyMode::Reset) => reset.is_ok(),
            _ = async {
                tokio::try_join!(
                    pump(client_read, store_write, Direction::ToStore, mode.clone()),
                    pump(store_read, client_write, Direction::ToClient, mode.clone()),
                )
            } => false,
        }
    };
    if reset {
        reset_on_close(&client);
        reset_on_close(&store);
    }
}

/// Makes the coming close send RST instead of FIN, so the peer sees a torn connection.
fn reset_on_close(stream: &TcpStream) {
    if let Err(error) = stream.set_zero_linger() {
        tracing::debug!(%error, "could not set SO_LINGER 0; the connection closes gracefully");
    }
}

async fn pump<R, W>(
    mut from: R,
    mut to: W,
    direction: Direction,
    mode: watch::Receiver<ProxyMode>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        let current = *mode.borrow();
        if let ProxyMode::Delay(delay) = current {
            tokio::time::sleep(delay).await;
        }
        // Look again: the mode may have changed while the chunk was held back.
        let forward = mode.borrow().forwards(direction);
        if n == 0 {
            if forward {
                to.shutdown().await?;
            }
            return Ok(());
        }
        if forward {
            to.write_all(&buf[..n]).await?;
        }
    }
}

/// A proxy as a client's link: cut is a silent partition, and slow replies delay each
/// direction by half the asked delay. The proxy holds back each chunk in each direction,
/// and bytes that arrive while one is held back wait for the next, so half each way keeps
/// a reply within about `delay` of the store applying the request (the ZooKeeper client
/// drops a connection silent for 2/5 of its session timeout: a whole round trip of the
/// asked delay is what it can live with).
/// One client's connection to the store, to cut or slow on purpose (a TCP fault proxy for
/// a server, the in-memory link for the memory backend).
pub trait LinkControl: Send + Sync {
    /// Every request and keep-alive of the client is lost from now on.
    fn cut(&self);
    /// The link works again.
    fn restore(&self);
    /// Replies (at least the session keep-alives' replies) reach the client `delay` after
    /// the store applied the request.
    fn delay_replies(&self, delay: Duration);
}

impl LinkControl for TcpFaultProxy {
    fn cut(&self) {
        self.set_mode(ProxyMode::BlackHole);
    }

    fn restore(&self) {
        self.set_mode(ProxyMode::Pass);
    }

    fn delay_replies(&self, delay: Duration) {
        self.set_mode(ProxyMode::Delay(delay / 2));
    }
}

/// The links of a client of several servers (every Redlock node, every cluster member),
/// cut or slowed together.
impl<L: LinkControl> LinkControl for Vec<L> {
    fn cut(&self) {
        self.iter().for_each(L::cut);
    }

    fn restore(&self) {
        self.iter().for_each(L::restore);
    }

    fn delay_replies(&self, delay: Duration) {
        self.iter().for_each(|link| link.delay_replies(delay));
    }
}
