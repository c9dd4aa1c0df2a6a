//! Release notifications fanned out to waiters: one feed per backend client, however the
//! store delivers them (an in-process channel, PostgreSQL NOTIFY, Redis pub/sub).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::backend::KeyWatch;
use crate::error::{Error, ErrorKind, Result};

#[derive(Clone, Debug)]
enum Change {
    Released(Arc<str>),
    /// Notifications may have been missed (a subscription restarted): everyone re-checks.
    Unknown,
}

/// Where a backend announces releases and its waiters subscribe.
///
/// Names are whatever the backend publishes for a key (the key itself, or the store's name
/// for it). A waiter wakes on its name's release, on [`wake_all`](Self::wake_all), and
/// whenever it fell behind, since a missed message may have been its own: spurious
/// wake-ups cost one attempt, missed ones a fallback poll.
#[derive(Clone, Debug)]
pub struct ReleaseFeed {
    changes: broadcast::Sender<Change>,
}

impl Default for ReleaseFeed {
    fn default() -> Self {
        ReleaseFeed::new()
    }
}

impl ReleaseFeed {
    /// A feed with room for 1,024 unread messages per waiter.
    pub fn new() -> Self {
        ReleaseFeed {
            changes: broadcast::channel(1024).0,
        }
    }

    /// Wakes the waiters of `name`.
    pub fn released(&self, name: &str) {
        // Nobody waiting is fine.
        let _ = self.changes.send(Change::Released(Arc::from(name)));
    }

    /// Wakes every waiter, for when releases may have gone unheard.
    pub fn wake_all(&self) {
        let _ = self.changes.send(Change::Unknown);
    }

    /// A watch for `name`, seeing every message sent from now on.
    pub fn watch(&self, name: impl Into<Arc<str>>) -> Box<dyn KeyWatch> {
        Box::new(FeedWatch {
            name: name.into(),
            changes: self.changes.subscribe(),
        })
    }
}

struct FeedWatch {
    name: Arc<str>,
    changes: broadcast::Receiver<Change>,
}

#[async_trait]
impl KeyWatch for FeedWatch {
    async fn changed(&mut self) -> Result<()> {
        loop {
            match self.changes.recv().await {
                Ok(Change::Released(name)) if name == self.name => return Ok(()),
                Ok(Change::Released(_)) => {}
                Ok(Change::Unknown) | Err(broadcast::error::RecvError::Lagged(_)) => return Ok(()),
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        "the release feed was shut down",
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn wakes(watch: &mut Box<dyn KeyWatch>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), watch.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn wakes_only_its_own_name_or_everyone() {
        let feed = ReleaseFeed::new();
        let mut watch = feed.watch("a");
        feed.released("b");
        assert!(!wakes(&mut watch).await);
        feed.released("a");
        assert!(wakes(&mut watch).await);
        feed.wake_all();
        assert!(wakes(&mut watch).await);
    }
}
