//! The in-memory reference backend as a suite factory.

use std::sync::Arc;
use std::time::Duration;

use lock_core::backend::async_trait;
use lock_core::backend::DynBackend;
use lock_core::memory::MemoryLink;
use lock_core::{LockKey, MemoryBackend};

use crate::factory::SessionEnder;
use crate::harness::{BackendFactory, LinkControl};

impl LinkControl for MemoryLink {
    fn cut(&self) {
        MemoryLink::cut(self);
    }
    fn restore(&self) {
        MemoryLink::restore(self);
    }
    fn delay_replies(&self, delay: Duration) {
        MemoryLink::delay_replies(self, delay);
    }
}

/// Clients of one shared in-memory store (plain or fair).
#[derive(Debug)]
pub struct MemoryFactory {
    store: MemoryBackend,
    name: &'static str,
}

impl MemoryFactory {
    /// A factory over a fresh store whose waiters poll with notifications.
    pub fn new() -> Self {
        MemoryFactory {
            store: MemoryBackend::new(),
            name: "memory",
        }
    }

    /// A factory over a fresh store with fair (FIFO) waiting.
    pub fn fair() -> Self {
        MemoryFactory {
            store: MemoryBackend::fair(),
            name: "memory-fair",
        }
    }

    /// A factory over a fresh fair store whose leases live by client sessions, each
    /// client with its own sessions and a link the session scenarios can cut.
    pub fn sessions() -> Self {
        MemoryFactory {
            store: MemoryBackend::fair().with_sessions(),
            name: "memory-session",
        }
    }
}

impl Default for MemoryFactory {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl BackendFactory for MemoryFactory {
    fn name(&self) -> String {
        self.name.to_string()
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        Ok(Arc::new(self.store.client()))
    }

    async fn connect_with_link(
        &self,
    ) -> Option<lock_core::Result<(DynBackend, Arc<dyn LinkControl>)>> {
        let client = self.store.client();
        let link = client.link()?;
        Some(Ok((Arc::new(client), Arc::new(link))))
    }

    fn session_ender(&self) -> Option<Arc<dyn SessionEnder>> {
        self.store
            .link()
            .is_some()
            .then(|| Arc::new(self.store.clone()) as Arc<dyn SessionEnder>)
    }
}

#[async_trait]
impl SessionEnder for MemoryBackend {
    async fn end_session_holding(&self, key: &str) -> lock_core::Result<()> {
        if MemoryBackend::end_session_holding(self, &LockKey::new(key)?) {
            Ok(())
        } else {
            Err(lock_core::Error::new(
                lock_core::ErrorKind::InvalidInput,
                format!("no live session holds {key:?}"),
            ))
        }
    }
}
