//! The memory backend's client sessions: one per distinct TTL (and one per lease renewed
//! by hand), pooled and kept alive by the core's [`SessionPool`], over a link that tests
//! can cut or slow.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::backend::{
    async_trait, lock_unpoisoned as lock, AcquireRequest, PooledSession, SessionKeeper,
    SessionKind, SessionNews, SessionPool, SessionStore,
};
use crate::memory::Store;
use crate::values::error::{Error, Result};

/// A client's sessions and its link to the store.
#[derive(Debug)]
pub(crate) struct ClientSessions {
    pool: SessionPool<MemorySessions>,
}

/// The memory store's side of a client's sessions.
#[derive(Debug)]
struct MemorySessions {
    store: Weak<Store>,
    link: Arc<Mutex<LinkState>>,
}

#[derive(Debug)]
pub(crate) struct ClientSession {
    pub(crate) store_id: u64,
    pub(crate) keeper: SessionKeeper,
}

impl PooledSession for ClientSession {
    fn keeper(&self) -> &SessionKeeper {
        &self.keeper
    }
}

#[derive(Debug, Default)]
struct LinkState {
    cut: bool,
    reply_delay: Duration,
}

/// A memory client's connection to its store, to cut or slow on purpose.
///
/// Cutting it makes every request of the client fail as unreachable and its keep-alives go
/// unanswered: the store then ends the client's sessions when their TTL runs out, as a
/// server does for a client behind a partition.
#[derive(Clone, Debug)]
pub struct MemoryLink {
    state: Arc<Mutex<LinkState>>,
}

impl MemoryLink {
    /// Every request and keep-alive of the client is lost from now on.
    pub fn cut(&self) {
        lock(&self.state).cut = true;
    }

    /// The link works again.
    pub fn restore(&self) {
        lock(&self.state).cut = false;
    }

    /// The store still applies each keep-alive at once, but its reply reaches the client
    /// `delay` later.
    pub fn delay_replies(&self, delay: Duration) {
        lock(&self.state).reply_delay = delay;
    }
}

impl ClientSessions {
    /// A new client of `store`, with no session yet and its link working.
    pub(crate) fn new(store: &Arc<Store>) -> Self {
        ClientSessions {
            pool: SessionPool::new(MemorySessions {
                store: Arc::downgrade(store),
                link: Arc::default(),
            }),
        }
    }

    pub(crate) fn link(&self) -> MemoryLink {
        MemoryLink {
            state: Arc::clone(&self.pool.store().link),
        }
    }

    pub(crate) fn reachable(&self) -> Result<()> {
        self.pool.store().reachable()
    }

    /// The session a grant of `request` lives by: the client's open one for its kind, or a
    /// new one (a session the store ended is never reused).
    pub(crate) async fn session_for(
        &self,
        request: &AcquireRequest,
        ttl: Duration,
    ) -> Result<Arc<ClientSession>> {
        self.pool
            .session(SessionKind::shared(request, ttl), ttl)
            .await
    }
}

impl MemorySessions {
    fn reachable(&self) -> Result<()> {
        if lock(&self.link).cut {
            return Err(Error::unavailable("the link to the memory store is cut"));
        }
        Ok(())
    }

    fn store(&self) -> Result<Arc<Store>> {
        self.store
            .upgrade()
            .ok_or_else(|| Error::unavailable("the memory store is gone"))
    }
}

#[async_trait]
impl SessionStore for MemorySessions {
    type Session = ClientSession;

    fn name(&self) -> &'static str {
        "memory"
    }

    async fn open(&self, _kind: SessionKind, ttl: Duration) -> Result<ClientSession> {
        let sent_at = crate::values::clock::now();
        let store_id = lock(&self.store()?.state).open_session(ttl);
        Ok(ClientSession {
            store_id,
            keeper: SessionKeeper::new(sent_at, ttl),
        })
    }

    /// Lost while the link is cut; applied at once, its answer arriving after the link's
    /// reply delay.
    async fn keep_alive(&self, session: &ClientSession) -> SessionNews {
        let Ok(store) = self.store() else {
            return SessionNews::Ended;
        };
        if self.reachable().is_err() {
            return SessionNews::Unanswered;
        }
        let ttl = session.keeper.status().ttl;
        let alive = lock(&store.state).keep_alive(session.store_id, ttl);
        drop(store);
        let delay = lock(&self.link).reply_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
            if self.reachable().is_err() {
                return SessionNews::Unanswered;
            }
        }
        if alive {
            SessionNews::Alive
        } else {
            SessionNews::Ended
        }
    }
}
