//! `distlock elect` as real processes on a SQLite file: one leader at a time, terms that
//! grow, the leader's value seen by others.

#![cfg(feature = "sqlite")]

mod support;

use support::{holder_of, let_go, Running, Store};

#[test]
fn one_leader_at_a_time_with_growing_terms() {
    let store = Store::sqlite();
    let (leader, first_term) = holder_of(&store, "elect", "scheduler", &["--value", "host-a"]);
    // The lock of the name shows the leader's term.
    let status = store.output(&["status", "--json", "scheduler"]);
    status.expect_code(0);
    assert!(
        status.stdout.contains(&format!("\"token\":{first_term}")),
        "{}",
        status.stdout
    );
    store
        .output(&["elect", "-n", "scheduler", "--", "true"])
        .expect_code(1);
    let waiting = Running::spawn(store.distlock(&[
        "--verbose",
        "elect",
        "scheduler",
        "-c",
        "echo \"term $DISTLOCK_TERM\"",
    ]));
    waiting.stderr_line_containing("waiting");
    let_go(leader);
    let line = waiting.line();
    let term: u64 = line
        .strip_prefix("term ")
        .and_then(|term| term.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    assert!(term > first_term, "{term} after {first_term}");
    assert_eq!(waiting.exit_code(), 0, "{}", waiting.rest_of_stderr());
    // Resigned: nobody leads.
    store.output(&["status", "scheduler"]).expect_code(1);
}

#[test]
fn elect_refuses_the_options_of_other_primitives() {
    let store = Store::sqlite();
    store
        .output(&["elect", "--shared", "k", "--", "true"])
        .expect_code(2);
}
