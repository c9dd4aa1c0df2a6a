//! The conformance suite against Redlock over five private redis-servers.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_redis::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::REDLOCK).await?,
        ])
    })
}
