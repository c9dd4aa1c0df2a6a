//! `distlock list` and `distlock break`, an operator's way out of a stuck key: on a SQLite
//! file and on private ZooKeeper and etcd servers, against keys held by `distlock run`
//! processes.

#![cfg(feature = "sqlite")] // The SQLite tests; the ZooKeeper ones also need `zookeeper`.

mod support;

use support::{Running, Store};

/// A `distlock run` holding `key` with a 15 s TTL (renewed every 5 s, so a broken lock is
/// noticed within seconds) until its stdin closes; its token and lease id.
fn hold(store: &Store, key: &str) -> (Running, u64, String) {
    let holder = Running::spawn(store.distlock(&[
        "run",
        "-t",
        "15s",
        key,
        "-c",
        "echo \"$DISTLOCK_TOKEN $DISTLOCK_LEASE_ID\"; read _ || true",
    ]));
    let line = holder.line();
    let (token, lease_id) = line.split_once(' ').expect("token and lease id");
    let token = token.parse().expect("a numeric token");
    (holder, token, lease_id.to_owned())
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|err| panic!("not JSON ({err}): {stdout}"))
}

/// When the broken holder's `distlock run` finds out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Noticed {
    /// At its next renewal: it stops its command (exit 75, as after any loss).
    AtNextRenewal,
    /// Only when its command ends and the release finds the lease gone (exit 75): a lease
    /// kept alive by its store session (etcd, ZooKeeper) is not renewed on its own, so
    /// nothing checks it before. A gap of the library's, not of the CLI's.
    #[cfg_attr(not(any(feature = "zookeeper", feature = "etcd")), allow(dead_code))]
    AtRelease,
}

/// A wrong token leaves the holder alone; the right one frees the key for the next run
/// (with a greater token), and the broken holder's run finds out as `noticed` says.
fn break_releases_only_the_named_holder(store: &Store, noticed: Noticed) {
    let (holder, token, _) = hold(store, "ops/stuck");

    let wrong = token + 1;
    let refused = store.output(&["break", "ops/stuck", "--token", &wrong.to_string()]);
    refused.expect_code(1);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    assert_eq!(refused.stderr.lines().count(), 1, "{}", refused.stderr);
    assert!(
        refused.stderr.starts_with("distlock: not broken: ")
            && refused
                .stderr
                .contains(&format!("held under token {token}, not {wrong}")),
        "{}",
        refused.stderr
    );
    let refused = store.output(&[
        "break",
        "--json",
        "ops/stuck",
        "--token",
        &wrong.to_string(),
    ]);
    refused.expect_code(1);
    assert_eq!(
        json(&refused.stdout),
        serde_json::json!({ "key": "ops/stuck", "token": wrong, "broken": false, "reason": "moved on" })
    );
    let still = store.output(&["status", "ops/stuck"]);
    still.expect_code(0);
    assert!(
        still
            .stdout
            .starts_with(&format!("ops/stuck: held, token {token}, ")),
        "{}",
        still.stdout
    );

    let broken = store.output(&[
        "break",
        "--json",
        "ops/stuck",
        "--token",
        &token.to_string(),
    ]);
    broken.expect_code(0);
    assert_eq!(
        json(&broken.stdout),
        serde_json::json!({ "key": "ops/stuck", "token": token, "broken": true })
    );

    let next = store.output(&["run", "-n", "ops/stuck", "-c", "echo $DISTLOCK_TOKEN"]);
    next.expect_code(0);
    let next_token: u64 = next.stdout.trim().parse().expect("a token");
    assert!(next_token > token, "{next_token} after {token}");

    if noticed == Noticed::AtNextRenewal {
        holder.stderr_line_containing("lost the lock on \"ops/stuck\"");
    } else {
        drop(holder.stdin_handle());
    }
    assert_eq!(holder.exit_code(), 75, "{}", holder.rest_of_stderr());
}

/// Breaking a free key touches nothing and says so (exit 1); a bad key is a usage error.
fn break_refuses_a_free_key(store: &Store) {
    let refused = store.output(&["break", "nobody/holds/this", "--token", "1"]);
    refused.expect_code(1);
    assert_eq!(refused.stderr.lines().count(), 1, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .starts_with("distlock: not broken: \"nobody/holds/this\" is not held"),
        "{}",
        refused.stderr
    );
    let refused = store.output(&["break", "--json", "nobody/holds/this", "--token", "1"]);
    refused.expect_code(1);
    assert_eq!(
        json(&refused.stdout),
        serde_json::json!({ "key": "nobody/holds/this", "token": 1, "broken": false, "reason": "free" })
    );
    store.output(&["break", "", "--token", "1"]).expect_code(2);
    store
        .output(&["break", "k", "--token", "-1"])
        .expect_code(2);
    store.output(&["break", "k"]).expect_code(2);
    store.output(&["list", "--limit", "0"]).expect_code(2);
}

#[test]
fn sqlite_break_releases_only_the_named_holder() {
    break_releases_only_the_named_holder(&Store::sqlite(), Noticed::AtNextRenewal);
}

#[test]
fn sqlite_break_refuses_a_free_key() {
    break_refuses_a_free_key(&Store::sqlite());
}

#[test]
fn sqlite_list_shows_held_keys_with_tokens_by_prefix() {
    list_shows_held_keys_with_tokens_by_prefix(&Store::sqlite());
}

/// Held keys by prefix, in key order, with their tokens and never a lease id; `--limit`
/// says when it cut the list; no key held is an empty list, exit 0.
fn list_shows_held_keys_with_tokens_by_prefix(store: &Store) {
    let (a, token_a, lease_a) = hold(store, "ops/a");
    let (b, token_b, lease_b) = hold(store, "ops/b");
    let (c, token_c, _) = hold(store, "other/c");

    let listed = store.output(&["list", "ops/"]);
    listed.expect_code(0);
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", listed.stdout);
    assert!(
        lines[0].starts_with(&format!("ops/a: held, token {token_a}, expires in ")),
        "{}",
        listed.stdout
    );
    assert!(
        lines[1].starts_with(&format!("ops/b: held, token {token_b}, expires in ")),
        "{}",
        listed.stdout
    );
    for lease_id in [&lease_a, &lease_b] {
        assert!(
            !listed.stdout.contains(lease_id.as_str()),
            "a lease id shown"
        );
    }
    assert!(listed.stderr.is_empty(), "{}", listed.stderr);

    let listed = store.output(&["list", "--json"]);
    listed.expect_code(0);
    for lease_id in [&lease_a, &lease_b] {
        assert!(
            !listed.stdout.contains(lease_id.as_str()),
            "a lease id shown"
        );
    }
    let value = json(&listed.stdout);
    assert_eq!(value["truncated"], false, "{value}");
    let keys = value["keys"].as_array().expect("keys");
    let seen: Vec<(&str, u64)> = keys
        .iter()
        .map(|key| {
            assert_eq!(key["held"], true, "{key}");
            let label = &key["holder"];
            assert!(
                label.is_null()
                    || label
                        .as_str()
                        .is_some_and(|label| label.starts_with("distlock run, pid ")),
                "{key}"
            );
            let ttl = key["remaining_ttl_ms"].as_u64().expect("remaining TTL");
            assert!(ttl > 0 && ttl <= 15_000, "{key}");
            (
                key["key"].as_str().expect("key"),
                key["token"].as_u64().expect("token"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("ops/a", token_a), ("ops/b", token_b), ("other/c", token_c)]
    );

    let cut = store.output(&["list", "--limit", "1", "--json", "ops/"]);
    cut.expect_code(0);
    let value = json(&cut.stdout);
    assert_eq!(value["truncated"], true, "{value}");
    assert_eq!(value["keys"].as_array().map(Vec::len), Some(1), "{value}");
    assert_eq!(value["keys"][0]["key"], "ops/a", "{value}");
    assert!(
        cut.stderr.contains("only the first 1 held keys"),
        "{}",
        cut.stderr
    );

    let none = store.output(&["list", "nothing/"]);
    none.expect_code(0);
    assert!(none.stdout.is_empty(), "{}", none.stdout);
    assert_eq!(
        none.stderr,
        "distlock: no held key starts with \"nothing/\"\n"
    );
    let none = store.output(&["list", "--json", "nothing/"]);
    assert_eq!(
        json(&none.stdout),
        serde_json::json!({ "keys": [], "truncated": false })
    );

    for holder in [&a, &b, &c] {
        drop(holder.stdin_handle());
        assert_eq!(holder.exit_code(), 0, "{}", holder.rest_of_stderr());
    }
    let empty = store.output(&["list"]);
    empty.expect_code(0);
    assert_eq!(
        (empty.stdout.as_str(), empty.stderr.as_str()),
        ("", "distlock: no key is held\n")
    );
    let empty = store.output(&["list", "--json"]);
    assert_eq!(
        json(&empty.stdout),
        serde_json::json!({ "keys": [], "truncated": false })
    );
}

/// A private store server (and the runtime its fixture was started on), and a store for
/// `distlock` on it.
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
struct Served {
    store: Store,
    _server: conformance_tests::store_process::StoreProcess,
    _runtime: tokio::runtime::Runtime,
}

/// Starts `spec`'s server; `url` names the store at the server's address.
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
fn served(
    spec: conformance_tests::store_process::StoreSpec,
    url: impl FnOnce(std::net::SocketAddr) -> String,
) -> Served {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let server = runtime
        .block_on(conformance_tests::store_process::StoreProcess::start(spec))
        .unwrap_or_else(|err| panic!("cannot start the store: {err}"));
    let url = url(server.addr());
    let dir = tempfile::tempdir().expect("a temp dir");
    Served {
        store: Store { dir, url },
        _server: server,
        _runtime: runtime,
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use conformance_tests::store_process::{
        StoreSpec, ZOOKEEPER_MAX_SESSION_TIMEOUT_MS, ZOOKEEPER_MIN_SESSION_TIMEOUT_MS,
        ZOOKEEPER_TICK_MS,
    };

    use super::support::Store;
    use super::{
        break_refuses_a_free_key, break_releases_only_the_named_holder,
        list_shows_held_keys_with_tokens_by_prefix, served, Noticed, Served,
    };

    /// A private standalone ZooKeeper server.
    fn zookeeper() -> Served {
        // The test server's session limits and tick, as the lock-zk tests give them.
        served(StoreSpec::zookeeper(), |addr| {
            format!(
                "zk://{addr}/?min_ttl_ms={ZOOKEEPER_MIN_SESSION_TIMEOUT_MS}&max_ttl_ms={ZOOKEEPER_MAX_SESSION_TIMEOUT_MS}&tick_ms={ZOOKEEPER_TICK_MS}"
            )
        })
    }

    #[test]
    fn zookeeper_list_shows_held_keys_with_tokens_by_prefix() {
        list_shows_held_keys_with_tokens_by_prefix(&zookeeper().store);
    }

    /// The Curator layout keeps no index of keys to list: the refusal is one line, exit
    /// 2, and points to `status`.
    #[test]
    fn zookeeper_curator_layout_refuses_to_list_in_one_line() {
        let mut zk = zookeeper();
        zk.store.url.push_str("&layout=curator");
        list_is_refused_in_one_line(&zk.store, "cannot be listed");
    }

    /// A store that cannot list its keys: the refusal is one line, exit 2, naming the kind
    /// and pointing to `status`.
    fn list_is_refused_in_one_line(store: &Store, reason: &str) {
        let refused = store.output(&["list"]);
        refused.expect_code(2);
        assert!(refused.stdout.is_empty(), "{}", refused.stdout);
        assert_eq!(refused.stderr.lines().count(), 1, "{}", refused.stderr);
        assert!(
            refused.stderr.starts_with("distlock: unsupported: ")
                && refused.stderr.contains(reason)
                && refused.stderr.contains("distlock status KEY"),
            "{}",
            refused.stderr
        );
    }

    #[test]
    fn zookeeper_break_releases_only_the_named_holder() {
        break_releases_only_the_named_holder(&zookeeper().store, Noticed::AtRelease);
    }

    #[test]
    fn zookeeper_break_refuses_a_free_key() {
        break_refuses_a_free_key(&zookeeper().store);
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use conformance_tests::store_process::StoreSpec;

    use super::{
        break_refuses_a_free_key, break_releases_only_the_named_holder,
        list_shows_held_keys_with_tokens_by_prefix, served, Noticed, Served,
    };

    /// A private single-member etcd.
    fn etcd() -> Served {
        let spec = StoreSpec::etcd().unwrap_or_else(|err| panic!("cannot set up etcd: {err}"));
        served(spec, |addr| format!("etcd://{addr}/distlock-cli-test"))
    }

    #[test]
    fn etcd_list_shows_held_keys_with_tokens_by_prefix() {
        list_shows_held_keys_with_tokens_by_prefix(&etcd().store);
    }

    #[test]
    fn etcd_break_releases_only_the_named_holder() {
        break_releases_only_the_named_holder(&etcd().store, Noticed::AtRelease);
    }

    #[test]
    fn etcd_break_refuses_a_free_key() {
        break_refuses_a_free_key(&etcd().store);
    }
}
