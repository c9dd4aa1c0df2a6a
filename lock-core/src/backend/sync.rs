//! Shared-state helpers used across the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex whose data stays consistent even if a holder panicked: every critical
/// section in the core and the backends leaves its data valid at each step, so a panic
/// elsewhere must not turn into a panic of every later lock user.
pub fn lock_unpoisoned<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
