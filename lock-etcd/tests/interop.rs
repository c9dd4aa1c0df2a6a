//! The etcd-mutex layout against etcd's own mutex (`etcdctl lock`, Debian's
//! `etcd-client`): each waits for the other on the same name.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use lock_core::LockClient;
use support::{connect, etcd_url, start_etcd};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const TTL: Duration = Duration::from_secs(2);

/// `etcdctl lock <name>`: it prints the name of its entry once it holds the lock, and
/// unlocks when terminated.
fn etcdctl_lock(addr: std::net::SocketAddr, name: &str) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={addr}"))
        .args(["lock", name])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl must be installed (Debian package etcd-client)");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

async fn terminate(mut child: Child) {
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SIGTERM: etcdctl revokes its session, which unlocks.
    #[allow(unsafe_code)]
    // SAFETY: signalling our own child process by its pid.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("etcdctl did not exit")
        .unwrap();
}

/// Waits until `key` has `waiters` waiters behind its holder.
async fn queued(client: &LockClient, key: &str, waiters: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = client.inspect(key).await.unwrap();
        if status.and_then(|s| s.waiters) == Some(waiters) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key}: nobody queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_waits_for_etcdctl_lock() {
    let server = start_etcd().await;
    let client =
        LockClient::from_dyn(connect(&etcd_url(&[server.addr()], "layout=etcd-mutex")).await);
    let (etcdctl, mut lines) = etcdctl_lock(server.addr(), "distlock-test/job");
    let entry = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("etcdctl never took the lock")
        .unwrap()
        .unwrap();
    assert!(entry.starts_with("distlock-test/job/"), "{entry}");
    let theirs = client
        .inspect("job")
        .await
        .unwrap()
        .expect("etcdctl's lock is not seen");
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("job")
                .ttl(TTL)
                .wait_up_to(Duration::from_secs(20))
                .await
        })
    };
    queued(&client, "job", 1).await;
    assert!(!waiting.is_finished(), "distlock took a lock etcdctl holds");
    terminate(etcdctl).await;
    let guard = waiting.await.unwrap().unwrap();
    assert!(guard.token() > theirs.token);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_waits_for_distlock() {
    let server = start_etcd().await;
    let client =
        LockClient::from_dyn(connect(&etcd_url(&[server.addr()], "layout=etcd-mutex")).await);
    let guard = client.lock("job").ttl(TTL).await.unwrap();
    let (etcdctl, mut lines) = etcdctl_lock(server.addr(), "distlock-test/job");
    queued(&client, "job", 1).await;
    let early = tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await;
    assert!(
        early.is_err(),
        "etcdctl took a lock distlock holds: {early:?}"
    );
    guard.release().await.unwrap();
    let entry = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("etcdctl never got the lock after the release")
        .unwrap()
        .unwrap();
    assert!(entry.starts_with("distlock-test/job/"), "{entry}");
    terminate(etcdctl).await;
    let again = client
        .lock("job")
        .ttl(TTL)
        .wait_up_to(Duration::from_secs(10))
        .await
        .unwrap();
    again.release().await.unwrap();
}
