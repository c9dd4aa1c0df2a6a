//! Interoperability with a lock client nobody here wrote: kazoo's `Lock` recipe (Python,
//! from PyPI) with `extra_lock_patterns=["-lock-"]`, which orders Curator-named nodes with
//! its own, contends with distlock's `layout=curator` on one lock path, both ways round.
//! A missing `python3` or kazoo is a failure, never a skip (`scripts/install-deps.sh`
//! installs kazoo).
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use lock_core::{ErrorKind, LockClient};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use support::{connect, start_zookeeper, zk_url};

/// Holds or waits for `path` with kazoo as told on stdin, saying what happened on stdout.
const KAZOO: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

hosts, path = sys.argv[1], sys.argv[2]
zk = KazooClient(hosts=hosts, timeout=10.0)
zk.start(timeout=20)
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
    fn start(hosts: &str, path: &str) -> Kazoo {
        let mut child = Command::new("python3")
            .args(["-c", KAZOO, hosts, path])
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
    let mut kazoo = Kazoo::start(&hosts, &format!("/{path}"));

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
