//! Deliberate defects of the core, switched on one at a time to prove that the seeded
//! simulation (`conformance-tests`, feature `simulation`) catches a broken engine, not only
//! a broken store: a fail-point switch in the spirit of TiKV's `fail` crate, scoped to one
//! thread.
//!
//! Only the `defects` feature makes the switch public; without it [`active`] is a constant
//! `false` and every defect compiles away. The switch is per thread because a simulation
//! run plays on one current-thread runtime (every task of the run, the engine's included,
//! polls on that thread) while other runs play on other threads at the same time.

use std::cell::Cell;

/// A defect of the core's own mechanics (the store underneath stays correct).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreDefect {
    /// A lease, granted or renewed, is measured from when the reply arrived instead of
    /// from when the request was sent, so a slow reply stretches the local deadline past
    /// the store's.
    LeaseFromReply,
    /// The renewal engine stops watching a lease whose local deadline passed without
    /// marking it lost: `lost()` never fires for a lease that simply ran out.
    NoLossAtDeadline,
    /// A fair-queue waiter that gives up (bound reached, cancelled, failed) never leaves
    /// the queue.
    QueueEntryKept,
    /// A waiter's pause between attempts is not cut at the end of its wait.
    PauseBeyondWait,
    /// A release whose first try went unanswered, retried and told that the lease is
    /// already gone (the first try had landed), reports `Lost` instead of `Ok`.
    RetriedReleaseLost,
}

thread_local! {
    static ACTIVE: Cell<Option<CoreDefect>> = const { Cell::new(None) };
}

/// Puts `defect` in force on this thread (`None`: the core is correct again).
#[cfg(feature = "defects")]
pub fn set(defect: Option<CoreDefect>) {
    ACTIVE.with(|active| active.set(defect));
}

/// Whether `defect` is in force on this thread.
pub(crate) fn active(defect: CoreDefect) -> bool {
    cfg!(feature = "defects") && ACTIVE.with(|active| active.get() == Some(defect))
}
