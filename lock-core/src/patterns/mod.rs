//! Patterns built on the lock: run once, run idempotently, scope a set of keys, elect a
//! leader, and refuse stale holders by their fencing token.

pub(crate) mod election;
pub(crate) mod fencing;
pub(crate) mod idempotent;
pub(crate) mod once;
pub(crate) mod scoped;

pub use election::{CampaignRequest, Candidate, LeaderChanges, LeaderStatus, Leadership};
pub use fencing::{FencedResource, StaleToken};
pub use idempotent::{Execution, IdempotentRequest, DEFAULT_RETENTION};
pub use once::{OnceRequest, OnceTicket};
pub use scoped::LockScope;
