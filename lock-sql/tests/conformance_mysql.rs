//! The conformance suite on a private MariaDB server started for the run.

use conformance_tests::run_suite;

mod support;

fn main() -> std::process::ExitCode {
    run_suite(|| async {
        Ok(vec![
            support::Database::mariadb().await?.into_factory().await?,
        ])
    })
}
