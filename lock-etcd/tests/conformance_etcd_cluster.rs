//! The conformance suite against a private three-member etcd cluster, through all three
//! endpoints.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_etcd::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::CLUSTER).await?,
        ])
    })
}
