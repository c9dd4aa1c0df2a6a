//! Store requests that must not be abandoned half-way.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Runs `request` like any future, but if the caller drops it before it finishes, the rest
/// of it runs to completion in the background instead of being cut off.
///
/// For backends: a request already sent may still be applied by the store after its
/// caller gave up. Finishing it, rather than dropping it, lets the backend know when it
/// has landed (for example, so that the clean-up release of an abandoned acquisition is
/// sent only after the acquisition itself), and costs nothing when nobody gives up.
pub fn finish_if_dropped<F>(request: F) -> FinishIfDropped<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    FinishIfDropped {
        request: Some(Box::pin(request)),
    }
}

/// The future returned by [`finish_if_dropped`].
#[must_use = "futures do nothing unless awaited"]
pub struct FinishIfDropped<T: Send + 'static> {
    request: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> Future for FinishIfDropped<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(request) = self.request.as_mut() else {
            // Polled again after completion: the contract of `Future` allows anything but
            // undefined behaviour; never finishing is the harmless choice.
            return Poll::Pending;
        };
        let output = request.as_mut().poll(cx);
        if output.is_ready() {
            self.request = None;
        }
        output
    }
}

impl<T: Send + 'static> Drop for FinishIfDropped<T> {
    fn drop(&mut self) {
        if let Some(request) = self.request.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(request);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn a_dropped_request_still_finishes() {
        let (done_tx, done_rx) = oneshot::channel();
        let request = finish_if_dropped(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = done_tx.send(());
        });
        assert!(tokio::time::timeout(Duration::from_millis(1), request)
            .await
            .is_err());
        tokio::time::timeout(Duration::from_secs(5), done_rx)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn an_awaited_request_returns_its_output() {
        assert_eq!(finish_if_dropped(async { 7 }).await, 7);
    }
}
