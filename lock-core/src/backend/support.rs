//! Small mechanisms every backend needs, written once.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::values::error::{Error, ErrorKind, Result};

/// Bounds one store request, turning silence into [`ErrorKind::Unavailable`] named as
/// [`Error::store`] names a failure: `{store}: {doing} failed: no answer within
/// {timeout:?}`.
pub async fn with_timeout<T>(
    store: &str,
    timeout: Duration,
    doing: &str,
    request: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(unanswered(store, doing, timeout)),
    }
}

/// [`with_timeout`] for a request sent at `sent_at`, which the caller measured anyway.
pub(crate) async fn within<T>(
    store: &str,
    sent_at: Instant,
    timeout: Duration,
    doing: &str,
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
        Err(_) => Err(unanswered(store, doing, timeout)),
    }
}

fn unanswered(store: &str, doing: &str, timeout: Duration) -> Error {
    Error::store(store, doing, ErrorKind::Unavailable)
        .hint(&format!("no answer within {timeout:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_unanswered_in_time_names_the_store_and_the_request() {
        let silent = std::future::pending::<Result<()>>();
        let err = with_timeout("etcd", Duration::from_millis(2), "renew", silent)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(err.message(), "etcd: renew failed: no answer within 2ms");
    }

    #[tokio::test]
    async fn a_request_unanswered_by_its_deadline_names_the_store_and_the_request() {
        let silent = std::future::pending::<Result<()>>();
        let sent_at = crate::values::clock::now();
        let err = within(
            "redis",
            sent_at,
            Duration::from_millis(1),
            "acquire",
            silent,
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(err.message(), "redis: acquire failed: no answer within 1ms");
    }
}
