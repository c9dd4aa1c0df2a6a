//! The distlock contract: one distributed-lock API for many stores.
//!
//! Users hold a [`LockClient`] over any backend and get [`LockGuard`]s from it. A backend
//! crate implements the few primitive operations of [`backend::LockBackend`]; this crate
//! builds everything else on them once, for every store: waiting with backoff, the
//! store's notifications or its fair queue, one renewal engine per client (per lease,
//! batched, or by session), the lost-lock signal, reentrancy through [`LockOwner`],
//! clean-up of abandoned acquisitions, and tracing. [`MemoryBackend`] is the reference
//! backend.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{FencedResource, LockClient, MemoryBackend};
//!
//! let client = LockClient::new(MemoryBackend::new());
//! let ledger = FencedResource::new(Vec::new());
//!
//! let guard = client.lock("ledger").ttl(Duration::from_secs(5)).await?;
//! // Every write carries the fencing token, so a holder whose lease ran out is refused.
//! ledger.write(guard.token(), |entries| entries.push("credit 10")).expect("newest token");
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The contract, and the conformance scenario that proves each guarantee on every
//! backend, are in the repository's `docs/contract.md`.

pub mod backend;
mod capabilities;
mod client;
mod engine;
mod error;
mod fencing;
mod guard;
mod idempotent;
mod key;
mod lease;
mod memory;
mod once;
mod options;
mod owner;
mod request;
mod scoped;
mod session;
mod status;
mod store_url;
mod sync;

pub use capabilities::{Capabilities, Liveness};
pub use client::LockClient;
pub use error::{Error, ErrorKind, Result};
pub use fencing::{FencedResource, StaleToken};
pub use guard::LockGuard;
pub use idempotent::{Execution, IdempotentRequest, DEFAULT_RETENTION};
pub use key::LockKey;
pub use lease::{FencingToken, Lease, LeaseId};
pub use memory::{MemoryBackend, MemoryLink};
pub use once::{OnceRequest, OnceTicket};
pub use options::{default_drift_allowance, AcquireOptions, Backoff, Renewal, Wait};
pub use owner::LockOwner;
pub use request::LockRequest;
pub use scoped::LockScope;
pub use status::LockStatus;
pub use store_url::{redact_url, StoreHost, StoreUrl};

/// Re-exported so backend crates implement [`backend::LockBackend`] with the same macro
/// version.
pub use async_trait::async_trait;
