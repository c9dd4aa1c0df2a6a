//! Sessions: one keep-alive for every lease granted under it
//! ([`Liveness::Session`](crate::Liveness::Session)).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// What the client knows of one store session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionStatus {
    /// When the latest request that proved the session alive was *sent* (a keep-alive the
    /// store answered, or the request that created the session). Never its reply time:
    /// the store started counting the session's TTL no earlier than the send.
    pub proven_at: Instant,
    /// How long the store keeps the session after a keep-alive arrives.
    pub ttl: Duration,
    /// Keep-alives go unanswered right now; deadlines stop moving.
    pub disconnected: bool,
    /// The store ended the session: every lease of it is gone.
    pub expired: bool,
}

/// The backend's side of a session: it reports every answered keep-alive, a lost
/// connection and the end of the session here, and hands [`Session`]s to the core with
/// each grant.
#[derive(Debug)]
pub struct SessionKeeper {
    id: u64,
    status: watch::Sender<SessionStatus>,
}

impl SessionKeeper {
    /// A session the store created in answer to a request sent at `sent_at`.
    pub fn new(sent_at: Instant, ttl: Duration) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SessionKeeper {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            status: watch::Sender::new(SessionStatus {
                proven_at: sent_at,
                ttl,
                disconnected: false,
                expired: false,
            }),
        }
    }

    /// The store answered a keep-alive sent at `sent_at`.
    pub fn kept_alive(&self, sent_at: Instant) {
        self.status.send_if_modified(|status| {
            if status.expired {
                return false;
            }
            let was = *status;
            status.proven_at = status.proven_at.max(sent_at);
            status.disconnected = false;
            *status != was
        });
    }

    /// Keep-alives are going unanswered (the connection is down or silent).
    pub fn disconnected(&self) {
        self.status.send_if_modified(|status| {
            let changed = !status.disconnected && !status.expired;
            status.disconnected = true;
            changed
        });
    }

    /// The store ended the session.
    pub fn expired(&self) {
        self.status.send_if_modified(|status| {
            let changed = !status.expired;
            status.expired = true;
            changed
        });
    }

    /// What the client knows of the session now.
    pub fn status(&self) -> SessionStatus {
        *self.status.borrow()
    }

    /// A handle for a grant under this session.
    pub fn session(&self) -> Session {
        Session {
            id: self.id,
            status: self.status.subscribe(),
        }
    }
}

/// A lease's view of the session it lives by: the core follows it to move the lease's
/// local deadline, and marks the lease lost when the session ends.
#[derive(Clone)]
pub struct Session {
    id: u64,
    status: watch::Receiver<SessionStatus>,
}

impl Session {
    /// A number that tells this session from the others of the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the client knows of the session now.
    pub fn status(&self) -> SessionStatus {
        *self.status.borrow()
    }

    /// Waits for the next change of status; `false` once the backend dropped the session
    /// (no further keep-alive will be reported).
    pub async fn changed(&mut self) -> bool {
        self.status.changed().await.is_ok()
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("status", &self.status())
            .finish()
    }
}

impl PartialEq for Session {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Session {}
