//! `distlock run --permits/--shared/--exclusive` and `status --kind` as real processes on a
//! SQLite file: semaphores and reader-writer locks from the shell.

#![cfg(feature = "sqlite")]

mod support;

use support::{holder, let_go, Store};

#[test]
fn permits_let_that_many_commands_run_at_once() {
    let store = Store::sqlite();
    let (first, first_token) = holder(&store, "encoders", &["--permits", "2"]);
    let (second, second_token) = holder(&store, "encoders", &["--permits", "2"]);
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    store
        .output(&["run", "-n", "--permits", "2", "encoders", "--", "true"])
        .expect_code(1);
    let listed = store.output(&["status", "--kind", "semaphore", "encoders"]);
    listed.expect_code(0);
    assert_eq!(
        listed.stdout.matches("permit of 2").count(),
        2,
        "{}",
        listed.stdout
    );
    let refused = store.output(&["run", "-n", "--permits", "3", "encoders", "--", "true"]);
    refused.expect_code(2);
    assert!(refused.stderr.contains('3'), "{}", refused.stderr);
    let_go(first);
    store
        .output(&["run", "-n", "--permits", "2", "encoders", "--", "true"])
        .expect_code(0);
    let_go(second);
    store
        .output(&["status", "--kind", "semaphore", "encoders"])
        .expect_code(1);
}

#[test]
fn shared_runs_together_and_exclusive_runs_alone() {
    let store = Store::sqlite();
    let (reader, _) = holder(&store, "catalog", &["--shared"]);
    let (other_reader, reader_token) = holder(&store, "catalog", &["--shared"]);
    store
        .output(&["run", "-n", "--exclusive", "catalog", "--", "true"])
        .expect_code(1);
    // The lock (mutex) of the same name is another key.
    store
        .output(&["run", "-n", "catalog", "--", "true"])
        .expect_code(0);
    let listed = store.output(&["status", "--kind", "rwlock", "--json", "catalog"]);
    listed.expect_code(0);
    let parsed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    assert_eq!(
        parsed[0]["holders"].as_array().map(Vec::len),
        Some(2),
        "{parsed}"
    );
    assert_eq!(parsed[0]["holders"][0]["hold"], "read", "{parsed}");
    let_go(reader);
    let_go(other_reader);
    let (writer, writer_token) = holder(&store, "catalog", &["--exclusive"]);
    assert!(
        writer_token > reader_token,
        "{writer_token} after {reader_token}"
    );
    store
        .output(&["run", "-n", "--shared", "catalog", "--", "true"])
        .expect_code(1);
    let_go(writer);
}

#[test]
fn shared_and_permits_do_not_mix() {
    let store = Store::sqlite();
    store
        .output(&["run", "--shared", "--permits", "2", "k", "--", "true"])
        .expect_code(2);
    store
        .output(&["run", "--shared", "--exclusive", "k", "--", "true"])
        .expect_code(2);
    store
        .output(&["status", "--kind", "semaphore", "--watch", "k"])
        .expect_code(2);
}
