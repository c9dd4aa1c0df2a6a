//! Interoperability with a lock client nobody here wrote: kazoo's `Lock` recipe (Python,
//! from PyPI) with `extra_lock_patterns=["-lock-"]`, which orders Curator-named nodes with
//! its own, contends with distlock's `layout=curator` on one lock path, both ways round;
//! so do kazoo's `ReadLock` and `WriteLock` with distlock's reader-writer lock.
//! A missing `python3` or kazoo is a failure, never a skip (`scripts/install-deps.sh`
//! installs kazoo).
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use lock_core::{ErrorKind, HoldKind, LockClient, Primitive};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use support::{connect, start_zookeeper, zk_url};

/// Holds or waits for `path` with kazoo as told on stdin, saying what happened on stdout:
/// with its `Lock` (`lock`), `ReadLock` (`read`) or `WriteLock` (`write`).
const KAZOO: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock, ReadLock, WriteLock

hosts, path, recipe = sys.argv[1], sys.argv[2], sys.argv[3]
zk = KazooClient(hosts=hosts, timeout=10.0)
zk.start(timeout=20)
if recipe == "read":
    lock = ReadLock(zk, path, identifier="kazoo")
elif recipe == "write":
    lock = WriteLock(zk, path, identifier="kazoo")
else:
    lock = Lock(zk, path, identifier="kazoo", extra_lock_patterns=["-lock-"])
for line in sys.stdin:
    command = line.strip()
    if command == "acquire":
        lock.acquire(timeout=30)
        print("held", flush=True)
    elif command == "try":
        print("held" if lock.acquire(blocking=False) else "busy", flush=True)
    elif command == "release":
        lock.release()
        print("released", flush=True)
    elif command == "contenders":
        print("contenders " + str(len(lock.contenders())), flush=True)
zk.stop()
"#;

struct Kazoo {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Kazoo {
    fn start(hosts: &str, path: &str, recipe: &str) -> Kazoo {
        let mut child = Command::new("python3")
            .args(["-c", KAZOO, hosts, path, recipe])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs (install it and kazoo with scripts/install-deps.sh)");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Kazoo { child, lines }
    }

    async fn send(&mut self, command: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    async fn answer(&mut self, within: Duration) -> String {
        tokio::time::timeout(within, self.lines.next_line())
            .await
            .expect("kazoo answers in time")
            .unwrap()
            .expect("kazoo ended (is kazoo installed? scripts/install-deps.sh installs it)")
    }
}

/// Kazoo holds: distlock cannot take the lock, waits behind it, and gets it once kazoo
/// releases. Then distlock holds: kazoo cannot take it, waits, and gets it once distlock
/// releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_and_kazoo_exclude_each_other() {
    let server = start_zookeeper().await;
    let path = format!("interop-{:016x}/lock", fastrand::u64(..));
    let hosts = server.addr().to_string();
    let client = LockClient::new(connect(&zk_url(&[server.addr()], "layout=curator")).await);
    let mut kazoo = Kazoo::start(&hosts, &format!("/{path}"), "lock");

    kazoo.send("acquire").await;
    assert_eq!(kazoo.answer(Duration::from_secs(30)).await, "held");
    let err = client.try_lock(&path).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err:?}");
    let kazoo_token = client.inspect(&path).await.unwrap().unwrap().token;
    let waiting = {
        let (client, path) = (client.clone(), path.clone());
        tokio::spawn(async move { client.lock(&path).wait_up_to(Duration::from_secs(30)).await })
    };
    // The waiter queues in the background: wait for its node before kazoo counts.
    let queued_by = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.inspect(&path).await.unwrap().unwrap().waiters != Some(1) {
        assert!(
            tokio::time::Instant::now() < queued_by,
            "distlock never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kazoo.send("contenders").await;
    assert_eq!(kazoo.answer(Duration::from_secs(5)).await, "contenders 2");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "distlock got a lock kazoo holds");
    kazoo.send("release").await;
    assert_eq!(kazoo.answer(Duration::from_secs(5)).await, "released");
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("distlock gets the lock after kazoo's release")
        .unwrap()
        .unwrap();
    assert!(guard.token() > kazoo_token);

    kazoo.send("try").await;
    assert_eq!(kazoo.answer(Duration::from_secs(5)).await, "busy");
    kazoo.send("acquire").await;
    let early = tokio::time::timeout(Duration::from_millis(300), kazoo.lines.next_line()).await;
    assert!(early.is_err(), "kazoo got a lock distlock holds: {early:?}");
    guard.release().await.unwrap();
    assert_eq!(kazoo.answer(Duration::from_secs(5)).await, "held");
    let err = client.try_lock(&path).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err:?}");
    kazoo.send("release").await;
    assert_eq!(kazoo.answer(Duration::from_secs(5)).await, "released");
    let guard = client.try_lock(&path).await.unwrap();
    guard.release().await.unwrap();
}

/// kazoo's `WriteLock` holds: distlock's reader is refused, waits, and is granted once kazoo
/// releases; a kazoo reader shares with it. Then distlock's writer holds: kazoo's reader
/// cannot take it, waits, and holds once distlock releases, sharing with a distlock reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_and_kazoo_share_a_reader_writer_lock() {
    let server = start_zookeeper().await;
    let path = format!("interop-{:016x}/rw", fastrand::u64(..));
    let hosts = server.addr().to_string();
    let client = LockClient::new(connect(&zk_url(&[server.addr()], "layout=curator")).await);
    let mut writer = Kazoo::start(&hosts, &format!("/{path}"), "write");
    let mut reader = Kazoo::start(&hosts, &format!("/{path}"), "read");

    writer.send("acquire").await;
    assert_eq!(writer.answer(Duration::from_secs(30)).await, "held");
    let err = client.read_lock(&path).no_wait().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err:?}");
    let holders = client.holders(&path, Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].kind, HoldKind::Write);
    let kazoo_token = holders[0].token;
    let waiting = {
        let (client, path) = (client.clone(), path.clone());
        tokio::spawn(async move {
            client
                .read_lock(&path)
                .wait_up_to(Duration::from_secs(30))
                .await
        })
    };
    let queued_by = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.holders(&path, Primitive::RwLock).await.unwrap()[0].waiters != Some(1) {
        assert!(
            tokio::time::Instant::now() < queued_by,
            "distlock never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writer.send("contenders").await;
    assert_eq!(writer.answer(Duration::from_secs(5)).await, "contenders 2");
    assert!(!waiting.is_finished(), "distlock read under kazoo's write");
    writer.send("release").await;
    assert_eq!(writer.answer(Duration::from_secs(5)).await, "released");
    let read = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("distlock reads after kazoo's write")
        .unwrap()
        .unwrap();
    assert!(read.token() > kazoo_token);
    // Readers of both share.
    reader.send("try").await;
    assert_eq!(reader.answer(Duration::from_secs(5)).await, "held");
    writer.send("try").await;
    assert_eq!(writer.answer(Duration::from_secs(5)).await, "busy");
    reader.send("release").await;
    assert_eq!(reader.answer(Duration::from_secs(5)).await, "released");
    read.release().await.unwrap();

    let write = client.write_lock(&path).no_wait().await.unwrap();
    reader.send("try").await;
    assert_eq!(reader.answer(Duration::from_secs(5)).await, "busy");
    reader.send("acquire").await;
    let early = tokio::time::timeout(Duration::from_millis(300), reader.lines.next_line()).await;
    assert!(
        early.is_err(),
        "kazoo read under distlock's write: {early:?}"
    );
    // A distlock reader after kazoo's waiting reader waits too (behind the writer).
    let err = client.read_lock(&path).no_wait().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err:?}");
    write.release().await.unwrap();
    assert_eq!(reader.answer(Duration::from_secs(5)).await, "held");
    let shared = client.read_lock(&path).no_wait().await.unwrap();
    let err = client.write_lock(&path).no_wait().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeldByAnother, "{err:?}");
    shared.release().await.unwrap();
    reader.send("release").await;
    assert_eq!(reader.answer(Duration::from_secs(5)).await, "released");
    let write = client.write_lock(&path).no_wait().await.unwrap();
    write.release().await.unwrap();
}

/// With layout=curator a semaphore is refused as unsupported, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_layout_refuses_semaphores() {
    let server = start_zookeeper().await;
    let client = LockClient::new(connect(&zk_url(&[server.addr()], "layout=curator")).await);
    let err = client
        .semaphore("locks/sem", 2)
        .no_wait()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err:?}");
    assert!(err.to_string().contains("kazoo"), "{err}");
}
