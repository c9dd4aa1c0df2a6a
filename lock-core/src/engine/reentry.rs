//! Reentrancy: the state of an owner that may take a key it already holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::backend::lock_unpoisoned as lock;
use crate::engine::acquire::{acquire_held, Keeping};
use crate::engine::held::HeldLock;
use crate::engine::ClientCore;
use crate::values::error::{Error, ErrorKind, Result};
use crate::values::key::{HoldKind, LockKey};
use crate::values::options::{AcquireOptions, Wait};

/// The keys one reentrant owner holds or is acquiring. Shared by the owner's clones.
#[derive(Debug, Default)]
pub(crate) struct OwnerState {
    slots: Mutex<HashMap<LockKey, Arc<Slot>>>,
}
/// The owner's state for one key.
#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Signalled when an acquisition of the key by one of the owner's tasks ends, so the
    /// tasks waiting for its outcome look again.
    settled: Notify,
}

#[derive(Debug, Default)]
struct SlotState {
    held: Option<(Arc<HeldLock>, usize)>,
    /// One of the owner's tasks is talking to the store for this key. The others do not
    /// queue behind it in the store (they would wait for their own owner) but wait for its
    /// outcome, each within its own bound.
    acquiring: bool,
}

/// A task's use of a key's slot; the slot is forgotten when the last use ends with
/// nothing held, also when the task is cancelled.
#[derive(Debug)]
struct SlotUse {
    owner: Arc<OwnerState>,
    key: LockKey,
    slot: Arc<Slot>,
}

impl Drop for SlotUse {
    fn drop(&mut self) {
        let mut slots = lock(&self.owner.slots);
        let idle = {
            let state = lock(&self.slot.state);
            state.held.is_none() && !state.acquiring
        };
        // The map's reference and this one: no other task uses the slot.
        if idle
            && Arc::strong_count(&self.slot) <= 2
            && slots
                .get(&self.key)
                .is_some_and(|current| Arc::ptr_eq(current, &self.slot))
        {
            slots.remove(&self.key);
        }
    }
}

/// The turn of the task that talks to the store; ending it (also by cancellation) lets
/// the owner's waiting tasks look again.
struct AcquiringTurn<'a>(&'a Slot);

impl Drop for AcquiringTurn<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).acquiring = false;
        self.0.settled.notify_waiters();
    }
}

/// A guard's link to its owner's entry count.
#[derive(Debug)]
pub(crate) struct Reentry {
    slot_use: SlotUse,
}

impl Reentry {
    /// Counts one release; `true` when it was the outermost and the store must be told.
    pub(crate) fn leave(self, held: &Arc<HeldLock>) -> bool {
        let mut state = lock(&self.slot_use.slot.state);
        match state.held.as_mut() {
            Some((current, count)) if Arc::ptr_eq(current, held) => {
                *count -= 1;
                if *count == 0 {
                    state.held = None;
                    true
                } else {
                    false
                }
            }
            // The lock was lost and replaced by a newer acquisition: this old one is not
            // counted any more.
            _ => true,
        }
    }
}

impl OwnerState {
    /// How many unreleased entries the owner has on `key` (0 when it does not hold it).
    pub(crate) fn holds(&self, key: &LockKey) -> usize {
        let slot = lock(&self.slots).get(key).cloned();
        slot.and_then(|slot| lock(&slot.state).held.as_ref().map(|(_, count)| *count))
            .unwrap_or(0)
    }

    /// How many keys the owner keeps state for (held, or being acquired).
    #[cfg(test)]
    pub(crate) fn tracked_keys(&self) -> usize {
        lock(&self.slots).len()
    }

    #[cfg(test)]
    pub(crate) fn is_acquiring(&self, key: &LockKey) -> bool {
        lock(&self.slots)
            .get(key)
            .is_some_and(|slot| lock(&slot.state).acquiring)
    }
}

/// Takes `key` for `owner`: re-enters a lease the owner holds, or acquires one. One task
/// of the owner at a time talks to the store for a key; the others wait for its outcome
/// within their own bounds.
pub(crate) async fn acquire_reentrant(
    core: &Arc<ClientCore>,
    owner: &Arc<OwnerState>,
    key: LockKey,
    mut options: AcquireOptions,
) -> Result<(Arc<HeldLock>, Reentry)> {
    if !core.backend.capabilities().reentrancy {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "backend {} does not support reentrant owners",
                core.backend.name()
            ),
        ));
    }
    let key = match key.kind() {
        // A writer may also read (a downgrade): the read re-enters its write hold, whose
        // token is at least every reader's.
        HoldKind::Read if owner.holds(&key.held_as(HoldKind::Write)?) > 0 => {
            key.held_as(HoldKind::Write)?
        }
        // A reader asking to write would wait for itself to stop reading: refused at once.
        HoldKind::Write
            if owner.holds(&key) == 0 && owner.holds(&key.held_as(HoldKind::Read)?) > 0 =>
        {
            return Err(Error::invalid(format!(
                "{:?}: this owner holds the read lock and asks for the write lock; an upgrade \
                 would wait for its own read hold for ever: release the read lock first",
                key.as_str()
            )));
        }
        _ => key,
    };
    let until = options.wait.deadline_from(crate::values::clock::now());
    let slot = Arc::clone(lock(&owner.slots).entry(key.clone()).or_default());
    let slot_use = SlotUse {
        owner: Arc::clone(owner),
        key: key.clone(),
        slot,
    };
    let slot = Arc::clone(&slot_use.slot);
    loop {
        let settled = {
            let mut state = lock(&slot.state);
            if let Some((held, count)) = state.held.as_mut() {
                if held.is_held() {
                    *count += 1;
                    let held = Arc::clone(held);
                    drop(state);
                    return Ok((held, Reentry { slot_use }));
                }
            }
            if !state.acquiring {
                state.acquiring = true;
                break;
            }
            // Made while the state is locked, so the acquirer's signal cannot slip
            // between this look and the wait.
            slot.settled.notified()
        };
        match until {
            _ if options.wait == Wait::No => {
                return Err(Error::new(
                    ErrorKind::HeldByAnother,
                    format!(
                        "{:?} is being acquired by another task of this owner",
                        key.as_str()
                    ),
                ))
            }
            None => settled.await,
            Some(until) => {
                let until = tokio::time::Instant::from_std(until);
                if tokio::time::timeout_at(until, settled).await.is_err() {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        format!(
                            "{:?} stayed held for the whole wait (another task of this \
                             owner was acquiring it)",
                            key.as_str()
                        ),
                    ));
                }
            }
        }
    }
    let turn = AcquiringTurn(&slot);
    if let (Some(until), Wait::UpTo(_)) = (until, options.wait) {
        // Time spent waiting for the owner's other task counts against the bound.
        options.wait = Wait::UpTo(until.saturating_duration_since(crate::values::clock::now()));
    }
    let held = acquire_held(core, key, options, Keeping::Renewed).await?;
    lock(&slot.state).held = Some((Arc::clone(&held), 1));
    drop(turn);
    Ok((held, Reentry { slot_use }))
}
