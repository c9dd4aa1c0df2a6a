//! The distlock contract: one distributed-lock API for many stores.
//!
//! A backend crate implements the few primitive operations of [`LockBackend`]; this crate
//! builds everything else on them once, for every store: waiting with backoff or the
//! store's notifications, watchdog renewal, the lost-lock signal, reentrancy through
//! [`LockOwner`], cleanup of abandoned acquisitions, and tracing. [`MemoryBackend`] is the
//! reference backend.
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
//! assert!(guard.release().await?);
//! # Ok(())
//! # }
//! ```
//!
//! The contract, and the conformance scenario that proves each guarantee on every
//! backend, are in the repository's `docs/contract.md`.

mod backend;
mod capabilities;
mod client;
mod detach;
mod error;
mod fencing;
mod guard;
mod key;
mod lease;
mod memory;
mod notify;
mod options;
mod owner;
mod store_url;
pub mod wait;

pub use backend::{DynBackend, KeyWatch, LockBackend, LockBackendExt, LockInfo, ReleaseOutcome};
pub use capabilities::Capabilities;
pub use client::{LockClient, LockRequest};
pub use detach::{finish_if_dropped, FinishIfDropped};
pub use error::{Error, ErrorKind, Result};
pub use fencing::{FencedResource, StaleToken};
pub use guard::LockGuard;
pub use key::LockKey;
pub use lease::{default_drift_allowance, AcquireRequest, FencingToken, Lease, LeaseId};
pub use memory::MemoryBackend;
pub use notify::ReleaseFeed;
pub use options::{AcquireOptions, Backoff, Renewal, Wait, WaitSpec};
pub use owner::LockOwner;
pub use store_url::{redact_url, StoreHost, StoreUrl};

/// Re-exported so backend crates implement [`LockBackend`] with the same macro version.
pub use async_trait::async_trait;
