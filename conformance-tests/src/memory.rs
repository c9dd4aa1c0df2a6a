//! The in-memory reference backend as a suite factory.

use lock_core::{async_trait, DynBackend, MemoryBackend};

use crate::harness::BackendFactory;

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
        Ok(std::sync::Arc::new(self.store.clone()))
    }

    async fn residue(&self, prefix: &str) -> lock_core::Result<Vec<String>> {
        Ok(self
            .store
            .stored_keys()
            .into_iter()
            .filter(|key| key.as_str().starts_with(prefix))
            .map(|key| key.to_string())
            .collect())
    }
}
