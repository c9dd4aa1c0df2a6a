//! `distlock status` on held and free keys, as text and JSON.

#![cfg(feature = "sqlite")] // Every test runs on a SQLite file (or the default stores).

mod support;

use support::{Running, Store};

#[test]
fn a_free_key_is_exit_1() {
    let store = Store::sqlite();
    let text = store.output(&["status", "nobody/holds/this"]);
    text.expect_code(1);
    assert_eq!(text.stdout, "nobody/holds/this: free\n");
    let json = store.output(&["status", "--json", "nobody/holds/this"]);
    json.expect_code(1);
    let value: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(
        value,
        serde_json::json!([{ "key": "nobody/holds/this", "held": false }])
    );
}

#[test]
fn a_held_key_shows_token_ttl_and_holder_but_never_the_lease_id() {
    let store = Store::sqlite();
    let holder = Running::spawn(store.distlock(&[
        "run",
        "-t",
        "1m",
        "--label",
        "nightly job 42",
        "reports",
        "-c",
        "echo \"$DISTLOCK_TOKEN $DISTLOCK_LEASE_ID\"; read _ || true",
    ]));
    let line = holder.line();
    let (token, lease_id) = line.split_once(' ').expect("token and lease id");

    let text = store.output(&["status", "reports"]);
    text.expect_code(0);
    assert!(
        text.stdout
            .starts_with(&format!("reports: held, token {token}, expires in ")),
        "{}",
        text.stdout
    );
    // SQLite keeps no holder label; a store that does shows it.
    assert!(
        !text.stdout.contains("holder") || text.stdout.contains("holder \"nightly job 42\""),
        "{}",
        text.stdout
    );
    assert!(
        !text.stdout.contains(lease_id),
        "the lease id is the holder's secret"
    );

    let json = store.output(&["status", "--json", "reports", "free-key"]);
    json.expect_code(1);
    assert!(
        !json.stdout.contains(lease_id),
        "the lease id is the holder's secret"
    );
    let value: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let held = &value[0];
    assert_eq!(held["key"], "reports");
    assert_eq!(held["held"], true);
    assert_eq!(held["token"].as_u64(), token.parse().ok());
    assert!(
        held["holder"].is_null() || held["holder"] == "nightly job 42",
        "{held}"
    );
    let remaining = held["remaining_ttl_ms"].as_u64().expect("remaining TTL");
    assert!(remaining > 0 && remaining <= 60_000, "{remaining}");
    assert_eq!(
        value[1],
        serde_json::json!({ "key": "free-key", "held": false })
    );

    drop(holder.stdin_handle());
    assert_eq!(holder.exit_code(), 0);
    store.output(&["status", "reports"]).expect_code(1);
}

/// The next line of `watcher` that `wanted` accepts (lines come every look).
fn line_where(watcher: &Running, what: &str, wanted: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + support::PATIENCE;
    loop {
        let line = watcher.line();
        if wanted(&line) {
            return line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not seen; last look: {line}"
        );
    }
}

/// `status --watch` looks again every interval: a key taken, renewed and given back shows
/// each change in the looks, with the holder's time and the renewals seen.
#[test]
fn watch_follows_a_key_through_its_holders_and_renewals() {
    let store = Store::sqlite();
    let watcher = Running::spawn(store.distlock(&[
        "status",
        "--watch",
        "--interval",
        "50ms",
        "jobs/watched",
    ]));
    assert_eq!(
        watcher.line(),
        "jobs/watched: free, 0 renewals, 0 handovers seen"
    );
    let holder = Running::spawn(store.distlock(&[
        "run",
        "-t",
        "900ms",
        "jobs/watched",
        "-c",
        "echo \"$DISTLOCK_TOKEN\"; read _ || true",
    ]));
    let token = holder.line();
    let taken = line_where(&watcher, "the key taken", |line| line.contains("held"));
    assert!(
        taken.starts_with(&format!("jobs/watched: held, token {token}, expires in ")),
        "{taken}"
    );
    assert!(taken.ends_with("0 renewals, 1 handover seen"), "{taken}");
    // Renewed every 300 ms: the expiry moves later while the token stays.
    let renewed = line_where(&watcher, "a renewal", |line| {
        line.contains("held") && !line.contains(" 0 renewals")
    });
    assert!(renewed.contains(", held "), "{renewed}");
    assert!(renewed.ends_with("1 handover seen"), "{renewed}");
    drop(holder.stdin_handle());
    assert_eq!(holder.exit_code(), 0);
    let freed = line_where(&watcher, "the key given back", |line| line.contains("free"));
    assert!(freed.starts_with("jobs/watched: free, "), "{freed}");
    assert!(!freed.contains(" 0 renewals"), "{freed}");
}

/// `--count` ends a watch after that many looks; `--json` gives one object per key and
/// look, one per line.
#[test]
fn watch_as_json_stops_after_its_count() {
    let store = Store::sqlite();
    let watched = store.output(&[
        "status",
        "--watch",
        "--json",
        "--count",
        "2",
        "--interval",
        "10ms",
        "a",
        "b",
    ]);
    watched.expect_code(0);
    let looks: Vec<serde_json::Value> = watched
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(looks.len(), 4, "{}", watched.stdout);
    for (look, key) in looks.iter().zip(["a", "b", "a", "b"]) {
        assert_eq!(
            look,
            &serde_json::json!({
                "key": key, "held": false, "held_for_ms": null,
                "renewals_seen": 0, "handovers_seen": 0,
            })
        );
    }
    // Without --watch, --count means nothing.
    store
        .output(&["status", "--count", "2", "a"])
        .expect_code(2);
}
