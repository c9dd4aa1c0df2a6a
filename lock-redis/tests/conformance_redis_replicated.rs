//! The conformance suite against a private primary with one replica, every grant, renewal
//! and record confirmed by the replica (`replicas=1`): the whole contract holds with
//! confirmation on.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_redis::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::REDIS_REPLICATED).await?,
        ])
    })
}
