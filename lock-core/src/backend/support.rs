//! Small mechanisms every backend needs, written once.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::values::error::{Error, Result};

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

/// [`with_timeout`] for a request sent at `sent_at`, which the caller measured anyway.
pub(crate) async fn within<T>(
    sent_at: Instant,
    timeout: Duration,
    operation: &str,
    request: impl Future<Output = Result<T>>,
) -> Result<T> {
    let mut request = std::pin::pin!(request);
    // An answer ready at once (an in-process store) needs no timer.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(request.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(result) = first {
        return result;
    }
    let deadline = crate::values::options::saturating_add(sent_at, timeout);
    match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), request).await {
        Ok(result) => result,
        Err(_) => Err(Error::unavailable(format!(
            "the store did not answer {operation} within {timeout:?}"
        ))),
    }
}
