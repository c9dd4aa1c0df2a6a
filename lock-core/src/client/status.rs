//! What anyone may learn about a key's holder.

use std::time::Duration;

use crate::values::lease::FencingToken;

/// Who holds a key, as [`LockClient::inspect`](crate::LockClient::inspect) tells it.
///
/// It never carries the holder's lease id: that id is the right to release and renew the
/// lease, and belongs to the holder alone.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The holder's fencing token.
    pub token: FencingToken,
    /// Time left before the store expires the lease, by the store's clock.
    pub remaining_ttl: Duration,
    /// How many acquisitions queue for the key, where the store keeps a queue; `None`
    /// when it does not know.
    pub waiters: Option<usize>,
    /// The holder's label ([`AcquireOptions::holder_label`](crate::AcquireOptions)), where
    /// the store keeps one.
    pub holder: Option<String>,
    /// How the holder holds the key: [`HoldKind::Mutex`](crate::HoldKind) for a lock, a
    /// permit, a read or a write for the other primitives.
    pub kind: crate::HoldKind,
}

impl From<crate::backend::HolderInfo> for LockStatus {
    fn from(info: crate::backend::HolderInfo) -> Self {
        LockStatus {
            token: info.token,
            remaining_ttl: info.remaining_ttl,
            waiters: info.waiters,
            holder: info.holder,
            kind: info.kind,
        }
    }
}
