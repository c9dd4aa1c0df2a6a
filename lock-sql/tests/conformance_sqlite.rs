//! The conformance suite on SQLite: one database file in a temporary directory.

use conformance_tests::run_suite_with;

mod support;

fn main() -> std::process::ExitCode {
    run_suite_with(lock_sql::STORE, || async {
        Ok(vec![
            support::Database::sqlite().await?.into_factory().await?,
        ])
    })
}
