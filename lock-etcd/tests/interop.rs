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
    let client = LockClient::new(connect(&etcd_url(&[server.addr()], "layout=etcd-mutex")).await);
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
    let client = LockClient::new(connect(&etcd_url(&[server.addr()], "layout=etcd-mutex")).await);
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

/// `list` in the etcd-mutex layout shows etcdctl's locks beside distlock's, in the user
/// keys' order although etcd orders their names otherwise (`job!/` sorts before `job/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_etcdctl_locks_in_key_order() {
    let server = start_etcd().await;
    let client = LockClient::new(connect(&etcd_url(&[server.addr()], "layout=etcd-mutex")).await);
    let (etcdctl, mut lines) = etcdctl_lock(server.addr(), "distlock-test/job");
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("etcdctl never took the lock")
        .unwrap()
        .unwrap();
    let guards = [
        client.lock("job!").ttl(TTL).await.unwrap(),
        client.lock("jo").ttl(TTL).await.unwrap(),
        client.lock("kx").ttl(TTL).await.unwrap(),
    ];
    let theirs = client.inspect("job").await.unwrap().unwrap();
    let listed = client.list("jo", 10).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["jo", "job", "job!"]);
    assert_eq!(listed[1].1.token, theirs.token);
    assert_eq!(listed[0].1.token, guards[1].token());
    assert_eq!(listed[2].1.token, guards[0].token());
    let first: Vec<String> = client
        .list("jo", 2)
        .await
        .unwrap()
        .into_iter()
        .map(|(key, _)| key.as_str().to_string())
        .collect();
    assert_eq!(first, ["jo", "job"]);
    terminate(etcdctl).await;
    for guard in guards {
        guard.release().await.unwrap();
    }
}
