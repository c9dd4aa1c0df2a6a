//! Plain values every layer shares: keys, leases and tokens, options, errors.

pub(crate) mod clock;
pub(crate) mod error;
pub(crate) mod key;
pub(crate) mod lease;
pub(crate) mod options;

pub use error::{Error, ErrorKind, Result};
pub use key::{HoldKind, LockKey, Primitive};
pub use lease::{FencingToken, Lease, LeaseId};
pub use options::{default_drift_allowance, AcquireOptions, Backoff, LeaseSharing, Renewal, Wait};
