//! The conformance suite against one private redis-server.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_redis::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::REDIS).await?,
        ])
    })
}
