//! The conformance suite on the in-memory reference backend, plain and fair.

use std::sync::Arc;

use conformance_tests::{run_suite, BackendFactory, MemoryFactory};

fn main() -> std::process::ExitCode {
    run_suite(|| async {
        Ok(vec![
            Arc::new(MemoryFactory::new()) as Arc<dyn BackendFactory>,
            Arc::new(MemoryFactory::fair()),
            Arc::new(MemoryFactory::sessions()),
        ])
    })
}
