//! Small mechanisms every backend needs, written once.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};

/// Bounds one store request, turning silence into
/// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable).
pub async fn with_timeout<T>(
    timeout: Duration,
    operation: &str,
    request: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(Error::unavailable(format!(
            "the store did not answer {operation} within {timeout:?}"
        ))),
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked: every critical
/// section in the core and the backends leaves its data valid at each step, so a panic
/// elsewhere must not turn into a panic of every later lock user.
pub fn lock_unpoisoned<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
