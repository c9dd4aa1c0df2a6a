//! Behaviour of the TCP fault proxy against a local echo server.

// Helpers outside #[test] fns panic on setup failures too, which is what a test wants.
#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::proxy::{ProxyMode, TcpFaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// Long enough that a forwarded reply would certainly have arrived on loopback.
const SILENCE: Duration = Duration::from_millis(300);
/// Upper bound for things that should happen "promptly"; generous for loaded CI machines.
const PROMPTLY: Duration = Duration::from_secs(5);

/// An echo server that counts the bytes it receives, so tests can see what reached the store.
async fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    counter.fetch_add(n, Ordering::SeqCst);
                    if stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, received)
}

async fn setup() -> (TcpFaultProxy, Arc<AtomicUsize>) {
    let (echo, received) = echo_server().await;
    (TcpFaultProxy::start(echo).await.unwrap(), received)
}

/// Sends `msg` and reads back exactly as many bytes, within `limit`.
async fn round_trip(stream: &mut TcpStream, msg: &[u8], limit: Duration) -> io::Result<Vec<u8>> {
    stream.write_all(msg).await?;
    let mut reply = vec![0u8; msg.len()];
    timeout(limit, stream.read_exact(&mut reply)).await??;
    Ok(reply)
}

/// Polls `condition` until it holds or `PROMPTLY` has passed.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + PROMPTLY;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The connection is torn down: a read ends with an error or end-of-stream, promptly.
async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 16];
    match timeout(PROMPTLY, stream.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!("read {n} bytes from a connection that should be closed"),
        Err(_) => panic!("connection still open after {PROMPTLY:?}"),
    }
}

#[tokio::test]
async fn pass_forwards_both_ways() {
    let (proxy, received) = setup().await;
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut client, b"hello", PROMPTLY).await.unwrap(),
        b"hello"
    );
    assert_eq!(
        round_trip(&mut client, b"again", PROMPTLY).await.unwrap(),
        b"again"
    );
    assert_eq!(received.load(Ordering::SeqCst), 10);
    eventually("the connection is counted", || proxy.connections() == 1).await;
    drop(client);
    eventually("the closed connection is no longer counted", || {
        proxy.connections() == 0
    })
    .await;
}

#[tokio::test]
async fn delay_holds_each_direction_back() {
    let (proxy, _) = setup().await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut client, b"warm", PROMPTLY).await.unwrap();

    let delay = Duration::from_millis(150);
    proxy.set_mode(ProxyMode::Delay(delay));
    let started = Instant::now();
    assert_eq!(
        round_trip(&mut client, b"slow", PROMPTLY).await.unwrap(),
        b"slow"
    );
    let elapsed = started.elapsed();
    // The request and the reply are each held back once.
    assert!(elapsed >= 2 * delay, "round trip took only {elapsed:?}");
    assert!(
        elapsed < 2 * delay + Duration::from_secs(2),
        "round trip took {elapsed:?}"
    );
}

/// An open connection survives a black hole: it resumes once the mode is `Pass` again, but
/// bytes sent during the black hole are lost, not delivered late.
#[tokio::test]
async fn black_hole_stalls_then_open_connection_resumes() {
    let (proxy, received) = setup().await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut client, b"before", PROMPTLY).await.unwrap();

    proxy.set_mode(ProxyMode::BlackHole);
    let stalled = round_trip(&mut client, b"lost", SILENCE).await.unwrap_err();
    assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);
    assert_eq!(
        received.load(Ordering::SeqCst),
        6,
        "the store saw black-holed bytes"
    );

    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(
        round_trip(&mut client, b"after", PROMPTLY).await.unwrap(),
        b"after"
    );
}

/// A connection opened during a black hole is accepted but hangs; it is connected through to
/// the store once the black hole lifts.
#[tokio::test]
async fn black_hole_parks_new_connections_until_lifted() {
    let (proxy, received) = setup().await;
    proxy.set_mode(ProxyMode::BlackHole);
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let stalled = round_trip(&mut client, b"lost", SILENCE).await.unwrap_err();
    assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);
    assert_eq!(proxy.connections(), 1);
    assert_eq!(received.load(Ordering::SeqCst), 0);

    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(
        round_trip(&mut client, b"now", PROMPTLY).await.unwrap(),
        b"now"
    );
}

#[tokio::test]
async fn reset_tears_down_open_and_new_connections() {
    let (proxy, _) = setup().await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut open, b"ping", PROMPTLY).await.unwrap();

    proxy.set_mode(ProxyMode::Reset);
    assert_closed(&mut open).await;
    eventually("no connection is left", || proxy.connections() == 0).await;

    // The kernel completes the handshake before the proxy accepts, so the connect itself
    // succeeds; the reset arrives right after.
    let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_closed(&mut new).await;
}

#[tokio::test]
async fn cut_replies_delivers_requests_but_drops_replies() {
    let (proxy, received) = setup().await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut client, b"ok", PROMPTLY).await.unwrap();

    proxy.set_mode(ProxyMode::CutReplies);
    client.write_all(b"applied").await.unwrap();
    eventually("the store received the request", || {
        received.load(Ordering::SeqCst) == 2 + 7
    })
    .await;
    let mut buf = [0u8; 16];
    assert!(
        timeout(SILENCE, client.read(&mut buf)).await.is_err(),
        "the client got a reply that should have been cut"
    );
}

#[tokio::test]
async fn refuses_non_loopback_targets() {
    let error = TcpFaultProxy::start("192.0.2.1:6379".parse().unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("192.0.2.1:6379"), "{error}");
}

#[tokio::test]
async fn shutdown_closes_connections_and_listener() {
    let (proxy, _) = setup().await;
    let addr = proxy.addr();
    let mut client = TcpStream::connect(addr).await.unwrap();
    round_trip(&mut client, b"ping", PROMPTLY).await.unwrap();

    proxy.shutdown().await;
    assert_closed(&mut client).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the proxy still accepts connections"
    );
}

#[tokio::test]
async fn drop_closes_connections() {
    let (proxy, _) = setup().await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut client, b"ping", PROMPTLY).await.unwrap();

    drop(proxy);
    assert_closed(&mut client).await;
}
