//! The memory backend's client sessions: one per distinct TTL (and one per lease renewed
//! by hand), each kept alive by its own task, over a link that tests can cut or slow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::backend::{lock_unpoisoned as lock, AcquireRequest, SessionKeeper};
use crate::error::{Error, Result};
use crate::lease::LeaseId;
use crate::memory::Store;
use crate::options::Renewal;

/// A client's sessions and its link to the store.
#[derive(Debug, Default)]
pub(crate) struct ClientSessions {
    open: Mutex<HashMap<SessionKind, Arc<ClientSession>>>,
    link: Arc<Mutex<LinkState>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SessionKind {
    /// Shared by the client's automatically renewed leases of one TTL.
    Auto(Duration),
    /// A lease renewed by hand lives by its own session, which only its renewals keep
    /// alive.
    Manual(LeaseId),
}

#[derive(Debug)]
pub(crate) struct ClientSession {
    pub(crate) store_id: u64,
    pub(crate) keeper: SessionKeeper,
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
    pub(crate) fn link(&self) -> MemoryLink {
        MemoryLink {
            state: Arc::clone(&self.link),
        }
    }

    pub(crate) fn reachable(&self) -> Result<()> {
        if lock(&self.link).cut {
            return Err(Error::unavailable("the link to the memory store is cut"));
        }
        Ok(())
    }

    /// The session a grant of `request` lives by: the client's open one for its kind, or a
    /// new one (a session the store ended is never reused).
    pub(crate) fn session_for(
        self: &Arc<Self>,
        store: &Arc<Store>,
        request: &AcquireRequest,
        ttl: Duration,
    ) -> Result<Arc<ClientSession>> {
        let kind = match request.renewal() {
            Renewal::Auto => SessionKind::Auto(ttl),
            Renewal::Manual => SessionKind::Manual(request.lease_id()),
        };
        let mut open = lock(&self.open);
        if let Some(session) = open.get(&kind) {
            if !session.keeper.status().expired {
                return Ok(Arc::clone(session));
            }
        }
        let sent_at = Instant::now();
        let store_id = lock(&store.state).open_session(ttl);
        let session = Arc::new(ClientSession {
            store_id,
            keeper: SessionKeeper::new(sent_at, ttl),
        });
        open.insert(kind, Arc::clone(&session));
        if let SessionKind::Auto(_) = kind {
            tokio::spawn(keep_alive(
                Arc::downgrade(store),
                Arc::downgrade(self),
                Arc::downgrade(&session),
                kind,
                ttl,
            ));
        }
        Ok(session)
    }
}

/// Keeps one session alive: a keep-alive every third of its TTL, reported with its send
/// time once the reply arrives. Ends with the session, or when the client is gone.
async fn keep_alive(
    store: Weak<Store>,
    client: Weak<ClientSessions>,
    session: Weak<ClientSession>,
    kind: SessionKind,
    ttl: Duration,
) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let (Some(store), Some(client), Some(session)) =
            (store.upgrade(), client.upgrade(), session.upgrade())
        else {
            return;
        };
        let sent_at = Instant::now();
        if lock(&client.link).cut {
            session.keeper.disconnected();
            continue;
        }
        let alive = lock(&store.state).keep_alive(session.store_id, ttl);
        let delay = lock(&client.link).reply_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
            if lock(&client.link).cut {
                session.keeper.disconnected();
                continue;
            }
        }
        if alive {
            session.keeper.kept_alive(sent_at);
        } else {
            session.keeper.expired();
            let mut open = lock(&client.open);
            if open.get(&kind).is_some_and(|s| Arc::ptr_eq(s, &session)) {
                open.remove(&kind);
            }
            return;
        }
    }
}
