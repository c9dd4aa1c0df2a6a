//! The conformance suite on a private PostgreSQL server started for the run.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_sql::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::POSTGRES).await?,
        ])
    })
}
