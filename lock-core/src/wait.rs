//! Waiting for a held key: polling with backoff, woken early by store notifications.

use std::time::Instant;

use tokio::time::{sleep_until, Instant as TokioInstant};

use crate::backend::{LockBackend, LockBackendExt};
use crate::error::{Error, ErrorKind, Result};
use crate::lease::{AcquireRequest, Lease};
use crate::options::WaitSpec;

/// The default [`LockBackend::acquire`]: attempt, and while the key is held pause with
/// exponential backoff and full jitter until the wait ends.
///
/// With native notification the pause also ends when the store reports a change; the
/// subscription is made *before* the first attempt, so a release between an attempt and
/// the pause cannot be missed, and the backoff still caps every pause, so a dropped
/// notification costs at most one poll interval. An unreachable store is retried within
/// the wait; if the wait ends while the store is unreachable the error is
/// [`ErrorKind::Unavailable`], not a time-out, because the key may well be free.
pub async fn acquire_by_polling<B: LockBackend + ?Sized>(
    backend: &B,
    request: &AcquireRequest,
    wait: &WaitSpec,
) -> Result<Lease> {
    let mut watch = if backend.capabilities().native_notification {
        match backend.watch(request.key()).await {
            Ok(watch) => watch,
            Err(err) => {
                tracing::debug!(error = %err, "subscription failed; polling instead");
                None
            }
        }
    } else {
        None
    };
    let mut attempt: u32 = 0;
    let mut store_answered = false;
    loop {
        let now = Instant::now();
        // Each attempt is bounded by the wait too, so a silent store cannot hold a
        // bounded waiter past its bound.
        let (timeout, cut_by_wait) = match wait.until {
            Some(until) if until > now && until - now < wait.request_timeout => (until - now, true),
            _ => (wait.request_timeout, false),
        };
        let failure = match backend.acquire_once(request, timeout).await {
            Ok(lease) => {
                tracing::Span::current().record("attempts", attempt + 1);
                return Ok(lease);
            }
            Err(err) if err.kind() == ErrorKind::HeldByAnother => {
                store_answered = true;
                err
            }
            // An attempt cut short by the end of the wait, on a store that has been
            // answering, means the wait is over, not that the store is gone.
            Err(err) if err.kind() == ErrorKind::Unavailable && cut_by_wait && store_answered => {
                Error::new(ErrorKind::HeldByAnother, err.message().to_string())
            }
            Err(err) if err.kind() == ErrorKind::Unavailable => err,
            Err(err) => return Err(err),
        };
        attempt = attempt.saturating_add(1);
        tracing::Span::current().record("attempts", attempt);
        let now = Instant::now();
        if let Some(until) = wait.until {
            if now >= until {
                return Err(match failure.kind() {
                    ErrorKind::HeldByAnother => Error::new(
                        ErrorKind::TimedOut,
                        format!(
                            "{:?} stayed held for the whole wait",
                            request.key().as_str()
                        ),
                    ),
                    _ => failure,
                });
            }
        }
        let mut wake = now + wait.backoff.pause(attempt - 1);
        if let Some(until) = wait.until {
            wake = wake.min(until);
        }
        match watch.as_mut() {
            Some(changes) if failure.kind() == ErrorKind::HeldByAnother => {
                let fallback = now + wait.backoff.max;
                let fallback = wait.until.map_or(fallback, |until| fallback.min(until));
                tokio::select! {
                    changed = changes.changed() => {
                        if let Err(err) = changed {
                            tracing::debug!(error = %err, "notification stream ended; polling instead");
                            watch = None;
                        }
                    }
                    () = sleep_until(TokioInstant::from_std(fallback)) => {}
                }
            }
            _ => sleep_until(TokioInstant::from_std(wake)).await,
        }
    }
}
