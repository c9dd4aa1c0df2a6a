//! What an idempotency record write costs in requests, counted by etcd itself: the
//! server's `grpc_server_handled_total` counters of unary calls, read from the
//! `/metrics` endpoint it serves on its client port.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use lock_core::backend::{AcquireRequest, LockBackend, LockBackendExt, Ownership, Record};
use lock_core::{FencingToken, LeaseId, LockKey, Renewal};
use support::{connect, etcd_url, start_etcd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Unary requests etcd has answered so far. Keep-alives are streams and never counted,
/// so a session kept alive meanwhile does not disturb the count.
async fn unary_calls(server: SocketAddr) -> u64 {
    let mut stream = tokio::net::TcpStream::connect(server).await.unwrap();
    // HTTP/1.0: the page comes whole, not in chunks that could cut a line.
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    page.lines()
        .filter(|line| {
            line.starts_with("grpc_server_handled_total{") && line.contains(r#"grpc_type="unary""#)
        })
        .map(|line| {
            let count = line.trim_end().rsplit(' ').next().unwrap();
            count.parse::<f64>().unwrap() as u64
        })
        .sum()
}

/// Each write's outcome and requests on a server of the given layout (`extra` URL
/// options): the holder's first, its second of the same retention, a stranger's, and the
/// holder's with a token it was not granted. Reads the record back after.
async fn counted_writes(extra: &str) -> Vec<(Ownership, u64)> {
    let server = start_etcd().await;
    let backend = connect(&etcd_url(&[server.addr()], extra)).await;
    let key = LockKey::new("counted").unwrap();
    let request = AcquireRequest::new(
        key.clone(),
        Duration::from_secs(30),
        Duration::ZERO,
        Renewal::Manual,
    );
    let lease = backend
        .acquire_once(&request, Duration::from_secs(5))
        .await
        .unwrap();
    let record = |value: &[u8], token: FencingToken| Record {
        value: value.to_vec(),
        fingerprint: None,
        token,
    };
    let granted = lease.token();
    let other = FencingToken::new(granted.get() + 1);
    let retention = Duration::from_secs(60);
    let mut costs = Vec::new();
    for (writer, written) in [
        (lease.id(), record(b"first", granted)),
        (lease.id(), record(b"again", granted)),
        (LeaseId::random(), record(b"stranger", granted)),
        (lease.id(), record(b"other token", other)),
    ] {
        let before = unary_calls(server.addr()).await;
        let outcome = backend
            .write_record(&key, writer, &written, retention)
            .await
            .unwrap();
        costs.push((outcome, unary_calls(server.addr()).await - before));
    }
    assert_eq!(
        backend.read_record(&key).await.unwrap(),
        Some(record(b"again", granted))
    );
    costs
}

/// In the distlock layout the holder's first record write of a retention takes two
/// requests (the record lease's grant and the fenced transaction), the next ones one;
/// refused writes take one and write nothing.
#[tokio::test]
async fn a_record_write_is_one_round_trip_once_its_lease_is_there() {
    use Ownership::{Held, NotHeld};
    assert_eq!(
        counted_writes("").await,
        [(Held, 2), (Held, 1), (NotHeld, 1), (NotHeld, 1)],
        "(outcome, requests) of each write"
    );
}

/// In the etcd-mutex layout an entry's name is not known from the lease id: one read
/// more to find it, and a write it finds with another token is refused without more.
#[tokio::test]
async fn a_record_write_in_the_etcd_mutex_layout_reads_the_entry_first() {
    use Ownership::{Held, NotHeld};
    assert_eq!(
        counted_writes("layout=etcd-mutex").await,
        [(Held, 3), (Held, 2), (NotHeld, 1), (NotHeld, 1)],
        "(outcome, requests) of each write"
    );
}
