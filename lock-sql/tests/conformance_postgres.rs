//! The conformance suite on a private PostgreSQL server started for the run.

use conformance_tests::run_suite;

mod support;

fn main() -> std::process::ExitCode {
    run_suite(|| async {
        Ok(vec![
            support::Database::postgres().await?.into_factory().await?,
        ])
    })
}
