//! Small mechanisms every backend needs, written once.

use std::future::Future;
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
