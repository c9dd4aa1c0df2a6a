//! The distlock conformance suite: one set of safety scenarios that every backend must
//! pass, plus the fault injection they rely on.
//!
//! Every scenario is a public `async fn(&Ctx) -> Outcome` in [`scenarios`], over a
//! [`BackendFactory`] that makes independent clients of the store under test. A backend's
//! test target is a few lines:
//!
//! ```no_run
//! use std::sync::Arc;
//! use conformance_tests::{run_suite, BackendFactory, MemoryFactory};
//!
//! fn main() -> std::process::ExitCode {
//!     run_suite(|| async { Ok(vec![Arc::new(MemoryFactory::new()) as Arc<dyn BackendFactory>]) })
//! }
//! ```
//!
//! A backend that other processes can reach passes its `STORE` entry to
//! [`run_suite_with`] instead, so the scenarios that kill a holder process can start the
//! test binary again as that holder.
//!
//! Faults are injected two ways: [`FaultyBackend`] wraps any backend and delays, fails,
//! silences, or applies-then-drops-the-reply of chosen operations; [`proxy::TcpFaultProxy`]
//! sits between a client and a real store to simulate partitions. [`store_process`]
//! starts private store servers on free loopback ports and can pause, kill and restart them.
//!
//! `simulation` (cargo feature `simulation`) plays seeded, randomized workloads with faults
//! through the core on the in-memory backend, on Tokio's paused clock, and checks the
//! recorded history against the contract.

pub mod capability_table;
pub mod factory;
mod failure;
pub mod faults;
pub mod harness;
mod holder_process;
mod memory;
pub mod network;
pub mod proxy;
pub mod requests;
mod runner;
pub mod scenarios;
#[cfg(feature = "simulation")]
pub mod simulation;
pub mod store_process;

pub use factory::{CountedStore, ServerFactory, ServerStore};
pub use faults::{Fault, FaultyBackend, Op};
pub use harness::{
    eventually, everything_shown, expect_kind, released, within, BackendFactory, Ctx, Failure,
    LinkControl, Outcome, SLACK,
};
pub use memory::MemoryFactory;
pub use runner::{run_suite, run_suite_with};
