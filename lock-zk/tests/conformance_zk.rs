//! The conformance suite against one private standalone ZooKeeper server.

mod support;

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_zk::STORE, || async {
        Ok(vec![
            conformance_tests::ServerFactory::start(support::ZOOKEEPER).await?,
        ])
    })
}
