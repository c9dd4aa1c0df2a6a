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
