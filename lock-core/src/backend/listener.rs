//! A store's notification listener, kept running: connect, subscribe, deliver, and on any
//! failure wake every waiter and reconnect with backoff.

use std::future::Future;
use std::time::Duration;

use tokio::task::AbortHandle;

use crate::backend::feed::ReleaseFeed;
use crate::backend::retry::{supervise, Progress};
use crate::values::error::Result;
use crate::values::options::Backoff;

/// Handed to each run of a listener: the feed to deliver releases into, and the way to say
/// the subscription is in place.
#[derive(Debug)]
pub struct ListenerLink {
    feed: ReleaseFeed,
    progress: Progress,
}

impl ListenerLink {
    /// Where releases go.
    pub fn feed(&self) -> &ReleaseFeed {
        &self.feed
    }

    /// The subscription is in place: releases announced while none was went unheard, so
    /// every waiter looks again, and the reconnect backoff starts afresh.
    pub fn subscribed(&self) {
        self.progress.made();
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

/// Reconnect pauses: from 50 ms, doubling to 5 s while runs fail before subscribing.
const RECONNECT: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(5),
};

/// Keeps `listen` running on the current tokio runtime until the returned task is dropped.
///
/// Each run connects, subscribes, calls [`ListenerLink::subscribed`], then delivers
/// releases into the feed until the connection fails. After a run ends every waiter is
/// woken (the next releases may go unheard until a new subscription is in place; the
/// waiters' fallback poll covers the gap) and the next run starts after a backoff that
/// doubles from 50 ms to 5 s while runs fail before subscribing ([`supervise`]).
pub fn supervise_listener<F, Fut>(
    what: &'static str,
    feed: ReleaseFeed,
    mut listen: F,
) -> ListenerTask
where
    F: FnMut(ListenerLink) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let task = tokio::spawn(supervise(what, RECONNECT, move |progress| {
        let feed = feed.clone();
        let run = listen(ListenerLink {
            feed: feed.clone(),
            progress,
        });
        async move {
            let outcome = run.await;
            feed.wake_all();
            outcome
        }
    }));
    ListenerTask(task.abort_handle())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::error::Error;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

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
