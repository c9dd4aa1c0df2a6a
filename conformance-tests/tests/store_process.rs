//! Behaviour of the store-process fixture against the real `redis-server`.
//!
//! These tests are never skipped: without `redis-server` they fail with the fixture's
//! "install the Debian package" message, because a silently green run would hide that the
//! backend scenarios cannot run on this machine.

// Helpers outside #[test] fns panic on setup failures too, which is what a test wants.
#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use conformance_tests::store_process::{StoreProcess, StoreProcessError, StoreSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Long enough that a running Redis on loopback would certainly have answered.
const SILENCE: Duration = Duration::from_millis(300);
const PROMPTLY: Duration = Duration::from_secs(5);

/// Sends one command as a RESP array and returns the raw reply (simple or bulk).
async fn command(addr: SocketAddr, args: &[&str], limit: Duration) -> io::Result<String> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request += &format!("${}\r\n{arg}\r\n", arg.len());
    }
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 512];
        while !reply_complete(&reply) {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            reply.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&reply).into_owned())
    };
    timeout(limit, exchange).await?
}

fn reply_complete(reply: &[u8]) -> bool {
    let Some(header_end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    match reply.first() {
        Some(b'$') => {
            let len: i64 = std::str::from_utf8(&reply[1..header_end])
                .unwrap()
                .parse()
                .unwrap();
            len < 0 || reply.len() >= header_end + 2 + len as usize + 2
        }
        _ => true,
    }
}

async fn ping(addr: SocketAddr, limit: Duration) -> io::Result<String> {
    command(addr, &["PING"], limit).await
}

async fn start(spec: StoreSpec) -> StoreProcess {
    StoreProcess::start(spec)
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

#[tokio::test]
async fn starts_on_a_private_port_and_answers() {
    let redis = start(StoreSpec::redis()).await;
    assert_ne!(
        redis.port(),
        6379,
        "must never use the machine's own Redis port"
    );
    assert_eq!(ping(redis.addr(), PROMPTLY).await.unwrap(), "+PONG\r\n");
    assert!(redis.data_dir().is_dir());
}

#[tokio::test]
async fn pause_silences_and_resume_revives() {
    let redis = start(StoreSpec::redis()).await;
    redis.pause().unwrap();
    let error = ping(redis.addr(), SILENCE).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");

    redis.resume().unwrap();
    assert_eq!(ping(redis.addr(), PROMPTLY).await.unwrap(), "+PONG\r\n");
}

#[tokio::test]
async fn kill_closes_the_port_and_restart_reopens_it() {
    let mut redis = start(StoreSpec::redis()).await;
    let port = redis.port();
    redis.kill().unwrap();
    assert_eq!(redis.pid(), None);
    assert!(
        TcpStream::connect(redis.addr()).await.is_err(),
        "killed server still accepts"
    );
    assert!(matches!(redis.pause(), Err(StoreProcessError::NotRunning)));

    redis.restart().await.unwrap();
    assert_eq!(redis.port(), port);
    assert_eq!(ping(redis.addr(), PROMPTLY).await.unwrap(), "+PONG\r\n");
}

#[tokio::test]
async fn restart_of_a_paused_server_answers() {
    let mut redis = start(StoreSpec::redis()).await;
    redis.pause().unwrap();
    redis.restart().await.unwrap();
    assert_eq!(ping(redis.addr(), PROMPTLY).await.unwrap(), "+PONG\r\n");
}

#[tokio::test]
async fn aof_writes_survive_kill_and_restart() {
    let mut redis = start(StoreSpec::redis_aof()).await;
    assert_eq!(
        command(redis.addr(), &["SET", "k", "v"], PROMPTLY)
            .await
            .unwrap(),
        "+OK\r\n"
    );
    redis.kill().unwrap();
    redis.restart().await.unwrap();
    assert_eq!(
        command(redis.addr(), &["GET", "k"], PROMPTLY)
            .await
            .unwrap(),
        "$1\r\nv\r\n"
    );
}

#[tokio::test]
async fn missing_binary_names_binary_and_package() {
    let spec = StoreSpec::new("definitely-not-a-real-server-binary", "imaginary-server");
    match StoreProcess::start(spec).await {
        Err(error @ StoreProcessError::BinaryMissing { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("definitely-not-a-real-server-binary"),
                "{message}"
            );
            assert!(message.contains("imaginary-server"), "{message}");
        }
        other => panic!("expected BinaryMissing, got {other:?}"),
    }
}

#[tokio::test]
async fn early_exit_reports_the_log_tail() {
    let spec = StoreSpec::new("redis-server", "redis-server").args(|port, _| {
        vec![
            "--port".into(),
            port.to_string(),
            "--no-such-directive".into(),
            "x".into(),
        ]
    });
    match StoreProcess::start(spec).await {
        Err(error @ StoreProcessError::Exited { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("no-such-directive"),
                "log tail missing: {message}"
            );
        }
        other => panic!("expected Exited, got {other:?}"),
    }
}

#[tokio::test]
async fn readiness_times_out_when_the_probe_never_passes() {
    let spec = StoreSpec::redis()
        .probe(|_| async { Err(io::Error::other("probe says no")) })
        .ready_timeout(Duration::from_millis(500));
    match StoreProcess::start(spec).await {
        Err(error @ StoreProcessError::NotReady { .. }) => {
            assert!(error.to_string().contains("probe says no"), "{error}");
        }
        other => panic!("expected NotReady, got {other:?}"),
    }
}

#[tokio::test]
async fn drop_kills_the_process() {
    let redis = start(StoreSpec::redis()).await;
    let pid = redis.pid().unwrap();
    let proc_entry = format!("/proc/{pid}");
    assert!(Path::new(&proc_entry).exists());
    drop(redis);
    // Drop reaps the process, so not even a zombie entry is left.
    assert!(
        !Path::new(&proc_entry).exists(),
        "pid {pid} still exists after drop"
    );
}
