//! A store's notification listener, kept running: connect, subscribe, deliver, and on any
//! failure wake every waiter and reconnect with backoff.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;

use crate::backend::feed::ReleaseFeed;
use crate::error::Result;

/// Handed to each run of a listener: the feed to deliver releases into, and the way to say
/// the subscription is in place.
#[derive(Debug)]
pub struct ListenerLink {
    feed: ReleaseFeed,
    subscribed: Arc<AtomicBool>,
}

impl ListenerLink {
    /// Where releases go.
    pub fn feed(&self) -> &ReleaseFeed {
        &self.feed
    }

    /// The subscription is in place: releases announced while none was went unheard, so
    /// every waiter looks again, and the reconnect backoff starts afresh.
    pub fn subscribed(&self) {
        self.subscribed.store(true, Ordering::SeqCst);
        self.feed.wake_all();
    }
}

/// The running listener; dropping it stops the listener.
#[derive(Debug)]
pub struct ListenerTask(AbortHandle);

impl Drop for ListenerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps `listen` running on the current tokio runtime until the returned task is dropped.
///
/// Each run connects, subscribes, calls [`ListenerLink::subscribed`], then delivers
/// releases into the feed until the connection fails. After a run ends every waiter is
/// woken (the next releases may go unheard until a new subscription is in place; the
/// waiters' fallback poll covers the gap) and the next run starts after a backoff that
/// doubles from 50 ms to 5 s while runs fail before subscribing.
pub fn supervise_listener<F, Fut>(
    what: &'static str,
    feed: ReleaseFeed,
    mut listen: F,
) -> ListenerTask
where
    F: FnMut(ListenerLink) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(5);
    let task = tokio::spawn(async move {
        let mut pause = FIRST;
        loop {
            let subscribed = Arc::new(AtomicBool::new(false));
            let link = ListenerLink {
                feed: feed.clone(),
                subscribed: Arc::clone(&subscribed),
            };
            let outcome = listen(link).await;
            feed.wake_all();
            if subscribed.load(Ordering::SeqCst) {
                pause = FIRST;
            }
            match outcome {
                Ok(()) => tracing::debug!(listener = what, "listener ended; reconnecting"),
                Err(err) => {
                    tracing::debug!(listener = what, error = %err, "listener failed; reconnecting")
                }
            }
            tokio::time::sleep(pause.mul_f64(0.5 + fastrand::f64() / 2.0)).await;
            pause = (pause * 2).min(MAX);
        }
    });
    ListenerTask(task.abort_handle())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::atomic::AtomicU32;

    #[tokio::test]
    async fn a_failed_listener_is_restarted_and_wakes_waiters() {
        let feed = ReleaseFeed::new();
        let mut watch = feed.watch("k");
        let runs = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&runs);
        let task = supervise_listener("test", feed.clone(), move |link| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if run == 0 {
                    return Err(Error::unavailable("connection refused"));
                }
                link.subscribed();
                std::future::pending::<()>().await;
                Ok(())
            }
        });
        tokio::time::timeout(Duration::from_secs(5), watch.changed())
            .await
            .expect("waiters were not woken")
            .expect("feed closed");
        tokio::time::timeout(Duration::from_secs(5), async {
            while runs.load(Ordering::SeqCst) < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the listener was not restarted");
        drop(task);
    }
}
