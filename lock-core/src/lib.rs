//! The distlock contract: one distributed-lock API for many stores.
//!
//! Users hold a [`LockClient`] over any backend and get [`LockGuard`]s from it. A backend
//! crate implements the few primitive operations of [`backend::LockBackend`]; this crate
//! builds everything else on them once, for every store: waiting with backoff, the
//! store's notifications or its fair queue, one renewal engine per client (per lease,
//! batched, or by session), the lost-lock signal, reentrancy through [`LockOwner`],
//! clean-up of abandoned acquisitions, and tracing. Beside the exclusive lock the client
//! offers counting semaphores ([`LockClient::semaphore`]), reader-writer locks
//! ([`LockClient::read_lock`], [`LockClient::write_lock`]) and lock sets
//! ([`LockClient::lock_all`]) with the same guarantees. [`MemoryBackend`] is the reference
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
//!
//! # Source layout
//!
//! The folders are the layers, each using only the ones below it:
//!
//! | folder | what it is |
//! |---|---|
//! | `client/` | what users call: [`LockClient`], [`LockRequest`], [`LockGuard`], [`LockOwner`], [`LockStatus`], [`LockSet`] |
//! | `patterns/` | built on the client: once, idempotent, scoped locks, fenced resources |
//! | `engine/` | store-agnostic mechanics: local lines, waiting, fair queues, renewal, clean-ups |
//! | `backend/` | the implementor's side ([`backend::LockBackend`]) and the toolkit every store reuses: session pool, retries, time-outs, URL grammar, store registry |
//! | `values/` | plain values every layer shares: keys, leases, tokens, options, errors |
//!
//! `memory/` is the reference backend, and `observe/` the metrics every layer reports.

pub mod backend;
mod client;
#[cfg(feature = "defects")]
#[doc(hidden)]
pub mod defects;
#[cfg(not(feature = "defects"))]
mod defects;
mod engine;
pub mod memory;
pub mod observe;
mod patterns;
mod values;

pub use backend::{Capabilities, Liveness};
pub use client::LockOwner;
pub use client::{LockClient, LockGuard, LockRequest, LockSet, LockSetRequest, LockStatus, Permit};
pub use engine::held::{LeaseHealth, LossReason};
pub use memory::MemoryBackend;
pub use patterns::{
    CampaignRequest, Candidate, Execution, FencedResource, IdempotentRequest, LeaderChanges,
    LeaderStatus, Leadership, LockScope, OnceRequest, OnceTicket, StaleToken,
};
pub use values::{
    AcquireOptions, Backoff, Error, ErrorKind, FencingToken, HoldKind, Lease, LeaseId,
    LeaseSharing, LockKey, Primitive, Renewal, Result, Wait,
};
