//! The etcd-mutex layout's reader-writer lock against the layout of etcd's Go
//! `recipe.RWMutex` (`go.etcd.io/etcd/client/v3/experimental/recipes`). No Go toolchain
//! runs here, so the recipe's steps are followed by hand with a raw etcd client, as the
//! recipe takes them: an entry `<name>/read/<nanoseconds>` or `<name>/write/<nanoseconds>`
//! created on its session's lease; a read holds once no key under `<name>/write` has a mod
//! revision below its own, a write once no key under `<name>/` does; each waits for the
//! deletion of the last such key, and unlocks by deleting its entry.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, WatchOptions,
};
use lock_core::{ErrorKind, HoldKind, LockClient, Primitive};
use support::{connect, etcd_url, start_etcd};

const TTL: Duration = Duration::from_secs(10);

/// The recipe's name for distlock's reader-writer lock `key` under the test prefix.
fn recipe_name(key: &str) -> String {
    format!("distlock-test#rwlock/{key}")
}

/// One lock of the recipe, as a Go service would hold it.
struct RecipeLock {
    client: Client,
    name: String,
    lease: i64,
    key: String,
    revision: i64,
    write: bool,
}

impl RecipeLock {
    /// `RLock`/`Lock`'s first step: the entry, created if absent, on a lease of its own.
    async fn queue(addr: std::net::SocketAddr, name: &str, write: bool) -> Self {
        let mut client = Client::connect([addr.to_string()], None).await.unwrap();
        let lease = client.lease_grant(30, None).await.unwrap().id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let kind = if write { "write" } else { "read" };
        let key = format!("{name}/{kind}/{nanos}");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                "",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let done = client.txn(txn).await.unwrap();
        assert!(done.succeeded());
        RecipeLock {
            client,
            name: name.to_string(),
            lease,
            key,
            revision: done.header().unwrap().revision(),
            write,
        }
    }

    /// The last key in the way (the recipe's `waitOnLastRev` read), `None` when it holds.
    async fn in_the_way(&mut self) -> Option<Vec<u8>> {
        let prefix = if self.write {
            format!("{}/", self.name)
        } else {
            format!("{}/write", self.name)
        };
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Mod, SortOrder::Descend)
            .with_limit(1)
            .with_max_mod_revision(self.revision - 1);
        let found = self.client.get(prefix, Some(options)).await.unwrap();
        found.kvs().first().map(|kv| kv.key().to_vec())
    }

    /// Waits until it holds, as `RLock`/`Lock` do, failing after `bound`.
    async fn wait(&mut self, bound: Duration) {
        let deadline = Instant::now() + bound;
        while let Some(key) = self.in_the_way().await {
            let options = WatchOptions::new().with_start_revision(self.revision);
            let mut stream = self.client.watch(key, Some(options)).await.unwrap();
            let deleted = async {
                while let Some(reply) = stream.message().await.unwrap() {
                    if reply
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return;
                    }
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::timeout(left, deleted)
                .await
                .expect("the recipe lock never got its turn");
        }
    }

    /// `RUnlock`/`Unlock`: the entry goes (with its lease, as the session's close does).
    async fn unlock(mut self) {
        self.client.delete(self.key.clone(), None).await.unwrap();
        self.client.lease_revoke(self.lease).await.unwrap();
    }
}

async fn mutex_layout_client(addr: std::net::SocketAddr) -> LockClient {
    LockClient::new(connect(&etcd_url(&[addr], "layout=etcd-mutex")).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_readers_and_distlock_readers_share_and_exclude_writers() {
    let server = start_etcd().await;
    let (client, other) = (
        mutex_layout_client(server.addr()).await,
        mutex_layout_client(server.addr()).await,
    );
    let mut go_reader = RecipeLock::queue(server.addr(), &recipe_name("doc"), false).await;
    assert_eq!(go_reader.in_the_way().await, None);
    let reader = client.read_lock("doc").ttl(TTL).no_wait().await.unwrap();
    assert!(reader.token().get() > go_reader.revision as u64);
    let refused = other.write_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let holders = client.holders("doc", Primitive::RwLock).await.unwrap();
    let seen: Vec<(HoldKind, u64)> = holders.iter().map(|h| (h.kind, h.token.get())).collect();
    assert_eq!(
        seen,
        vec![
            (HoldKind::Read, go_reader.revision as u64),
            (HoldKind::Read, reader.token().get())
        ]
    );
    reader.release().await.unwrap();
    let refused = other.write_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    go_reader.unlock().await;
    let writer = other.write_lock("doc").ttl(TTL).no_wait().await.unwrap();
    writer.release().await.unwrap();
    let probe = connect(&etcd_url(&[server.addr()], "layout=etcd-mutex")).await;
    assert!(probe.stored_keys("").await.unwrap().is_empty());
}

/// A recipe writer queued behind distlock's reader waits for it, and distlock's readers
/// that come after the writer wait for it in turn (its entry is a `write/` one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipe_writer_waits_for_distlock_readers_and_goes_before_later_ones() {
    let server = start_etcd().await;
    let (client, other) = (
        mutex_layout_client(server.addr()).await,
        mutex_layout_client(server.addr()).await,
    );
    let reader = client.read_lock("doc").ttl(TTL).no_wait().await.unwrap();
    let mut go_writer = RecipeLock::queue(server.addr(), &recipe_name("doc"), true).await;
    let blocking = go_writer.in_the_way().await.unwrap();
    assert!(
        String::from_utf8(blocking).unwrap().contains("/read/"),
        "the writer waits for distlock's read entry"
    );
    let refused = other.read_lock("doc").ttl(TTL).no_wait().await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::HeldByAnother);
    let late_reader = {
        let other = other.clone();
        tokio::spawn(async move { other.read_lock("doc").ttl(TTL).await })
    };
    let writing = tokio::spawn(async move {
        go_writer.wait(Duration::from_secs(20)).await;
        go_writer
    });
    reader.release().await.unwrap();
    let go_writer = writing.await.unwrap();
    let holders = client.holders("doc", Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, HoldKind::Write);
    assert!(!late_reader.is_finished(), "a reader went with the writer");
    let written = go_writer.revision;
    go_writer.unlock().await;
    let late_reader = late_reader.await.unwrap().unwrap();
    assert!(late_reader.token().get() > written as u64);
    late_reader.release().await.unwrap();
}

/// distlock's writer holds the recipe's readers off until it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distlock_writer_holds_recipe_readers_off() {
    let server = start_etcd().await;
    let client = mutex_layout_client(server.addr()).await;
    let writer = client.write_lock("doc").ttl(TTL).no_wait().await.unwrap();
    let mut go_reader = RecipeLock::queue(server.addr(), &recipe_name("doc"), false).await;
    assert!(go_reader.in_the_way().await.is_some());
    let reading = tokio::spawn(async move {
        go_reader.wait(Duration::from_secs(20)).await;
        go_reader
    });
    writer.release().await.unwrap();
    let go_reader = reading.await.unwrap();
    let holders = client.holders("doc", Primitive::RwLock).await.unwrap();
    assert_eq!(holders.len(), 1);
    go_reader.unlock().await;
}

/// etcd has no semaphore to lay out: the etcd-mutex layout refuses them, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_mutex_layout_refuses_semaphores() {
    let server = start_etcd().await;
    let client = mutex_layout_client(server.addr()).await;
    let err = client.semaphore("s", 2).ttl(TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("layout=distlock"), "{err}");
    let err = client.read_lock("a/b").ttl(TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}
