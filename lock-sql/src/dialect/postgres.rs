//! PostgreSQL, with waiters woken by LISTEN/NOTIFY.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{async_trait, redact_url, Error, ErrorKind, KeyWatch, Result};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgQueryResult};
use sqlx::{Pool, Postgres};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use super::{RowsAffected, SqlText};
use crate::config::SqlConfig;

pub(crate) const SQL: SqlText = SqlText {
    migrate: include_str!("../../sql/postgres/migrate.sql"),
    acquire: include_str!("../../sql/postgres/acquire.sql"),
    renew: include_str!("../../sql/postgres/renew.sql"),
    release: include_str!("../../sql/postgres/release.sql"),
    inspect: include_str!("../../sql/postgres/inspect.sql"),
    stored_keys: include_str!("../../sql/postgres/stored_keys.sql"),
    sweep: include_str!("../../sql/postgres/sweep.sql"),
    // statement_timestamp() is fixed for one statement (now() would be fixed for the
    // whole transaction, the same thing in autocommit).
    now_ms: "(extract(epoch FROM statement_timestamp()) * 1000)::bigint",
};

/// How long a new subscriber waits for the shared listener's first LISTEN, so that a
/// release right after the waiter's first attempt is not missed. If it takes longer the
/// waiter goes on and relies on its fallback poll.
const LISTEN_READY_WAIT: Duration = Duration::from_secs(2);
/// Pause between attempts to re-establish a failed listener connection.
const RELISTEN_PAUSE: Duration = Duration::from_millis(200);

impl RowsAffected for PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// A pool for the URL. No connection is opened yet.
pub(crate) fn pool(config: &SqlConfig) -> Result<Pool<Postgres>> {
    let options = PgConnectOptions::from_str(config.target()).map_err(|err| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("invalid PostgreSQL URL {}", redact_url(config.target())),
        )
        .with_source(err)
    })?;
    Ok(PgPoolOptions::new()
        .max_connections(config.pool_size)
        .acquire_timeout(config.connect_timeout)
        .connect_lazy_with(options))
}

/// What the shared listener passes on to subscribers.
#[derive(Clone, Debug)]
enum Change {
    /// This key was released.
    Released(Arc<str>),
    /// Notifications may have been missed (listener reconnected): everyone re-checks.
    Unknown,
}

/// One LISTEN connection per backend, serving the waiters of every key.
#[derive(Debug)]
pub(crate) struct Notifier {
    changes: broadcast::Sender<Change>,
    listening: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Notifier {
    /// Starts the listener task; must be called inside a tokio runtime.
    pub(crate) fn start(pool: Pool<Postgres>, channel: String) -> Self {
        let (changes, _) = broadcast::channel(1024);
        let (listening_tx, listening) = watch::channel(false);
        let task = tokio::spawn(listen(pool, channel, changes.clone(), listening_tx));
        Notifier {
            changes,
            listening,
            task,
        }
    }

    /// A subscription for `key`, made once the listener is listening (or after a short
    /// wait for it, falling back to the poll).
    pub(crate) async fn subscribe(&self, key: &str) -> Box<dyn KeyWatch> {
        let changes = self.changes.subscribe();
        let mut listening = self.listening.clone();
        let _ = tokio::time::timeout(LISTEN_READY_WAIT, listening.wait_for(|ready| *ready)).await;
        Box::new(PgKeyWatch {
            key: key.to_owned(),
            changes,
        })
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn listen(
    pool: Pool<Postgres>,
    channel: String,
    changes: broadcast::Sender<Change>,
    listening: watch::Sender<bool>,
) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::debug!(error = %err, "LISTEN connection failed; retrying");
                tokio::time::sleep(RELISTEN_PAUSE).await;
                continue;
            }
        };
        if let Err(err) = listener.listen(&channel).await {
            tracing::debug!(error = %err, "LISTEN failed; retrying");
            tokio::time::sleep(RELISTEN_PAUSE).await;
            continue;
        }
        listening.send_replace(true);
        // Releases between the previous connection's loss and this LISTEN were missed.
        let _ = changes.send(Change::Unknown);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    let _ = changes.send(Change::Released(Arc::from(notification.payload())));
                }
                // The connection was lost; the next call reconnects and re-listens.
                Ok(None) => {
                    let _ = changes.send(Change::Unknown);
                }
                Err(err) => {
                    tracing::debug!(error = %err, "LISTEN connection broke; reconnecting");
                    let _ = changes.send(Change::Unknown);
                    tokio::time::sleep(RELISTEN_PAUSE).await;
                    break;
                }
            }
        }
    }
}

/// One waiter's view of the shared listener, filtered to its key.
struct PgKeyWatch {
    key: String,
    changes: broadcast::Receiver<Change>,
}

#[async_trait]
impl KeyWatch for PgKeyWatch {
    async fn changed(&mut self) -> Result<()> {
        loop {
            match self.changes.recv().await {
                Ok(Change::Released(key)) if *key == *self.key => return Ok(()),
                Ok(Change::Released(_)) => {}
                // Missed notifications: a spurious wake-up is the safe answer.
                Ok(Change::Unknown) | Err(broadcast::error::RecvError::Lagged(_)) => return Ok(()),
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        "the PostgreSQL notification listener stopped",
                    ))
                }
            }
        }
    }
}
