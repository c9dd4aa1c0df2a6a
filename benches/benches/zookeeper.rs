//! lock-zk against the raw ZooKeeper operations it issues and the `zookeeper-client`
//! crate's own `lock` recipe, on a private standalone server started for the run (the test
//! fixture's server: 100 ms ticks, transaction log not fsynced).
//!
//! Run with `cargo bench -p distlock-benches --bench zookeeper`.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use conformance_tests::store_process::{
    StoreProcess, StoreSpec, ZOOKEEPER_MAX_SESSION_TIMEOUT_MS, ZOOKEEPER_MIN_SESSION_TIMEOUT_MS,
};
use distlock_benches::{
    acquired, distinct_keys, one_key, one_key_library, report, sample, wait_for_next_holder, Sample,
};
use lock_core::{AcquireOptions, LeaseId, LockClient, Renewal};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, LockOptions, LockPrefix};

const RUNS: usize = 2000;
const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = StoreProcess::start(StoreSpec::zookeeper())
        .await
        .expect("ZooKeeper (Debian package `zookeeper`) must be installed for this bench");
    let addr = server.addr().to_string();
    let url = format!(
        "zk://{addr}/?min_ttl_ms={ZOOKEEPER_MIN_SESSION_TIMEOUT_MS}&max_ttl_ms={ZOOKEEPER_MAX_SESSION_TIMEOUT_MS}"
    );
    println!("ZooKeeper on {addr}");

    let raw = raw_cycle(&addr).await;
    report("raw create + list + delete", &raw);
    let library = library_cycle(&url, Renewal::Auto, RUNS).await;
    report("lock-zk try_lock + release (auto renewal)", &library);
    let peer = crate_lock_cycle(&addr).await;
    report("zookeeper-client lock + drop", &peer);
    println!(
        "ratio to raw: lock-zk auto {:.2}x, zookeeper-client lock {:.2}x",
        ratio(&library, &raw),
        ratio(&peer, &raw)
    );
    // A lease renewed by hand has a session of its own: connecting it is part of the cost.
    let manual = library_cycle(&url, Renewal::Manual, RUNS / 10).await;
    report("lock-zk try_lock + release (manual)", &manual);

    // Closed before the runs that follow, so its session does not linger into them.
    let client = library_client(&url, Renewal::Auto).await;
    distinct_keys("lock-zk 16 tasks, distinct keys", &client, 16, 300).await;
    drop(client);
    one_key_raw(&addr).await;
    one_key_library("lock-zk 8 tasks, one key", || {
        let url = url.clone();
        async move { library_client(&url, Renewal::Auto).await }
    })
    .await;
    one_key_crate_lock(&addr).await;
}

fn ratio(a: &Sample, b: &Sample) -> f64 {
    a.median.as_secs_f64() / b.median.as_secs_f64()
}

async fn library_client(url: &str, renewal: Renewal) -> LockClient {
    LockClient::new(lock_zk::connect(url).await.unwrap()).with_defaults(AcquireOptions {
        ttl: TTL,
        renewal,
        ..AcquireOptions::default()
    })
}

async fn raw_client(addr: &str) -> Client {
    Client::connector()
        .with_session_timeout(TTL)
        .connect(addr)
        .await
        .unwrap()
}

/// Protected-mode node name, as lock-zk and Curator make it.
fn node_prefix() -> String {
    let hex = LeaseId::random().to_string();
    format!(
        "_c_{}-{}-{}-{}-{}-lock-",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Creates an ephemeral-sequential child of the container `parent` (creating the
/// container when the server has reaped it), returning its name.
async fn create_child(client: &Client, parent: &str) -> String {
    let prefix = node_prefix();
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    loop {
        match client
            .create(&format!("{parent}/{prefix}"), b"30000", &options)
            .await
        {
            Ok((_, sequence)) => return format!("{prefix}{sequence}"),
            Err(ZkError::NoNode) => {
                let container = CreateMode::Container.with_acls(Acls::anyone_all());
                match client.create(parent, &[], &container).await {
                    Ok(_) | Err(ZkError::NodeExists) => {}
                    Err(err) => panic!("{err}"),
                }
            }
            Err(err) => panic!("{err}"),
        }
    }
}

/// The operations lock-zk issues for an uncontended `try_lock` and release, by hand.
async fn raw_cycle(addr: &str) -> Sample {
    let client = raw_client(addr).await;
    client
        .mkdir(
            "/raw",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    sample(RUNS, || {
        let client = &client;
        async move {
            let name = create_child(client, "/raw/bench").await;
            let children = client.list_children("/raw/bench").await.unwrap();
            assert!(children.contains(&name));
            client
                .delete(&format!("/raw/bench/{name}"), None)
                .await
                .unwrap();
        }
    })
    .await
}

async fn library_cycle(url: &str, renewal: Renewal, runs: usize) -> Sample {
    let client = library_client(url, renewal).await;
    sample(runs, || {
        let client = &client;
        async move {
            let guard = client.try_lock("bench/uncontended").await.unwrap();
            guard.release().await.unwrap();
        }
    })
    .await
}

fn crate_lock_options() -> LockOptions<'static> {
    LockOptions::new(Acls::anyone_all())
        .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .unwrap()
}

/// The `zookeeper-client` crate's recipe: `lock` waits for the turn; dropping the guard
/// deletes the node in the background.
async fn crate_lock_cycle(addr: &str) -> Sample {
    let client = raw_client(addr).await;
    sample(RUNS, || {
        let client = &client;
        async move {
            let prefix = LockPrefix::new_curator("/zkc/bench", "lock-").unwrap();
            let lock = client
                .lock(prefix, b"", crate_lock_options())
                .await
                .unwrap();
            drop(lock);
        }
    })
    .await
}

/// The raw predecessor-watch handoff: create, list, watch the node ahead until first,
/// delete.
async fn one_key_raw(addr: &str) {
    one_key(
        "raw predecessor watch, 8 tasks, one key",
        |task, stats, count, deadline| {
            let addr = addr.to_string();
            async move {
                let client = raw_client(&addr).await;
                client
                    .mkdir(
                        "/raw",
                        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
                    )
                    .await
                    .unwrap();
                while Instant::now() < deadline {
                    let name = create_child(&client, "/raw/one-key").await;
                    loop {
                        let mut children = client.list_children("/raw/one-key").await.unwrap();
                        children.sort_by(|a, b| a[a.len() - 10..].cmp(&b[b.len() - 10..]));
                        let at = children.iter().position(|c| *c == name).unwrap();
                        if at == 0 {
                            break;
                        }
                        let ahead = format!("/raw/one-key/{}", children[at - 1]);
                        if let (Some(_), watcher) =
                            client.check_and_watch_stat(&ahead).await.unwrap()
                        {
                            watcher.changed().await;
                        }
                    }
                    let mine = acquired(&stats, &count, task);
                    client
                        .delete(&format!("/raw/one-key/{name}"), None)
                        .await
                        .unwrap();
                    wait_for_next_holder(&count, mine, deadline).await;
                }
            }
        },
    )
    .await;
}

async fn one_key_crate_lock(addr: &str) {
    one_key(
        "zookeeper-client lock 8 tasks, one key",
        |task, stats, count, deadline| {
            let addr = addr.to_string();
            async move {
                let client = raw_client(&addr).await;
                while Instant::now() < deadline {
                    let prefix = LockPrefix::new_curator("/zkc/one-key", "lock-").unwrap();
                    let lock = client
                        .lock(prefix, b"", crate_lock_options())
                        .await
                        .unwrap();
                    let mine = acquired(&stats, &count, task);
                    drop(lock);
                    wait_for_next_holder(&count, mine, deadline).await;
                }
            }
        },
    )
    .await;
}
