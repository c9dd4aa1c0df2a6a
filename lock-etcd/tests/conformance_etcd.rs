//! The conformance suite against one private single-member etcd.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_etcd::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::ETCD).await?,
        ])
    })
}
