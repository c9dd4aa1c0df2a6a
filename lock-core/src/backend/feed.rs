//! Release notifications handed to waiters: one feed per backend client, however the store
//! delivers them (an in-process call, PostgreSQL NOTIFY, Redis pub/sub).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{watch, Notify};

use crate::backend::lock_unpoisoned as lock;
use crate::backend::{Change, KeyWatch};
use crate::values::error::{Error, ErrorKind, Result};

/// Where a backend announces releases and its waiters subscribe.
///
/// Names are whatever the backend publishes for a key (the key itself, or the store's name
/// for it). A release wakes *one* waiter of that name (the longest waiting one that has
/// not been woken yet), not all of them: only one can win the key, so waking the rest
/// would only send a herd of doomed attempts to the store. A waiter that is dropped with a
/// wake-up it never used hands it on to the next. [`wake_all`](Self::wake_all) wakes
/// everyone, for when releases may have gone unheard. Spurious wake-ups cost one attempt;
/// missed ones are covered by the waiter's fallback poll.
#[derive(Clone, Debug)]
pub struct ReleaseFeed {
    inner: Arc<Feed>,
}

#[derive(Debug)]
struct Feed {
    waiters: Mutex<HashMap<Arc<str>, VecDeque<Arc<Waiter>>>>,
    /// Bumped by `wake_all`; every watch sees the change.
    everyone: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Waiter {
    wake: Notify,
    /// Woken and not yet seen by the waiter.
    woken: AtomicBool,
}

impl Default for ReleaseFeed {
    fn default() -> Self {
        ReleaseFeed::new()
    }
}

impl Feed {
    /// Wakes the first waiter of `name` that is not woken already.
    fn wake_one(&self, name: &str) {
        let waiters = lock(&self.waiters);
        let Some(queue) = waiters.get(name) else {
            return;
        };
        if let Some(waiter) = queue.iter().find(|w| !w.woken.load(Ordering::SeqCst)) {
            waiter.woken.store(true, Ordering::SeqCst);
            // Stored as a permit if the waiter is between two attempts right now.
            waiter.wake.notify_one();
        }
    }
}

impl ReleaseFeed {
    /// A feed with no waiters.
    pub fn new() -> Self {
        ReleaseFeed {
            inner: Arc::new(Feed {
                waiters: Mutex::new(HashMap::new()),
                everyone: watch::Sender::new(0),
            }),
        }
    }

    /// Wakes one waiter of `name`.
    pub fn released(&self, name: &str) {
        self.inner.wake_one(name);
    }

    /// Wakes every waiter of `name`: for a release of a semaphore's or reader-writer
    /// lock's holder, after which several waiters may be granted at once (all the readers
    /// behind a writer), so waking one would leave the others to their fallback poll.
    pub fn released_to_many(&self, name: &str) {
        let waiters = lock(&self.inner.waiters);
        for waiter in waiters.get(name).into_iter().flatten() {
            if !waiter.woken.swap(true, Ordering::SeqCst) {
                waiter.wake.notify_one();
            }
        }
    }

    /// Wakes every waiter, for when releases may have gone unheard.
    pub fn wake_all(&self) {
        self.inner.everyone.send_modify(|epoch| *epoch += 1);
    }

    /// A watch for `name`, woken by releases announced from now on.
    pub fn watch(&self, name: impl Into<Arc<str>>) -> Box<dyn KeyWatch> {
        let name = name.into();
        let waiter = Arc::new(Waiter::default());
        lock(&self.inner.waiters)
            .entry(Arc::clone(&name))
            .or_default()
            .push_back(Arc::clone(&waiter));
        Box::new(FeedWatch {
            feed: Arc::clone(&self.inner),
            everyone: self.inner.everyone.subscribe(),
            name,
            waiter,
        })
    }
}

struct FeedWatch {
    feed: Arc<Feed>,
    everyone: watch::Receiver<u64>,
    name: Arc<str>,
    waiter: Arc<Waiter>,
}

#[async_trait]
impl KeyWatch for FeedWatch {
    async fn changed(&mut self) -> Result<Change> {
        tokio::select! {
            () = self.waiter.wake.notified() => {
                self.waiter.woken.store(false, Ordering::SeqCst);
                Ok(Change::Released)
            }
            changed = self.everyone.changed() => changed
                .map(|()| Change::LookAgain)
                .map_err(|_| Error::new(ErrorKind::Internal, "the release feed was shut down")),
        }
    }
}

impl Drop for FeedWatch {
    fn drop(&mut self) {
        {
            let mut waiters = lock(&self.feed.waiters);
            if let Some(queue) = waiters.get_mut(&self.name) {
                queue.retain(|w| !Arc::ptr_eq(w, &self.waiter));
                if queue.is_empty() {
                    waiters.remove(&self.name);
                }
            }
        }
        // A wake-up this waiter never used belongs to the next one.
        if self.waiter.woken.load(Ordering::SeqCst) {
            self.feed.wake_one(&self.name);
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
        assert!(!wakes(&mut watch).await);
    }

    #[tokio::test]
    async fn one_release_wakes_one_waiter_in_arrival_order() {
        let feed = ReleaseFeed::new();
        let (mut first, mut second) = (feed.watch("k"), feed.watch("k"));
        feed.released("k");
        assert!(wakes(&mut first).await);
        assert!(!wakes(&mut second).await);
        feed.released("k");
        feed.released("k");
        assert!(wakes(&mut first).await);
        assert!(wakes(&mut second).await);
    }

    #[tokio::test]
    async fn a_release_to_many_wakes_every_waiter_of_its_name_only() {
        let feed = ReleaseFeed::new();
        let mut first = feed.watch("k");
        let mut second = feed.watch("k");
        let mut other = feed.watch("j");
        feed.released_to_many("k");
        assert!(wakes(&mut first).await);
        assert!(wakes(&mut second).await);
        assert!(!wakes(&mut other).await);
    }

    #[tokio::test]
    async fn an_unused_wake_up_passes_on_when_its_waiter_leaves() {
        let feed = ReleaseFeed::new();
        let (first, mut second) = (feed.watch("k"), feed.watch("k"));
        feed.released("k");
        drop(first);
        assert!(wakes(&mut second).await);
        drop(second);
        assert!(lock(&feed.inner.waiters).is_empty(), "waiters left behind");
    }
}
