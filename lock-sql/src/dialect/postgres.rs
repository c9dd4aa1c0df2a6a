//! PostgreSQL, with waiters woken by LISTEN/NOTIFY.

use std::time::Duration;

use lock_core::{KeyWatch, ReleaseFeed, Result};
use sqlx::postgres::{PgConnectOptions, PgListener, PgQueryResult};
use sqlx::{Pool, Postgres};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{lazy_pool, sql_text, url_options, RowsAffected, SqlText};
use crate::config::SqlConfig;

pub(crate) const SQL: SqlText = sql_text!(
    "postgres",
    // statement_timestamp() is fixed for one statement (now() would be fixed for the
    // whole transaction, the same thing in autocommit).
    now_ms: "(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
);

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
    let options: PgConnectOptions = url_options(config, "PostgreSQL")?;
    Ok(lazy_pool(config, options))
}

/// One LISTEN connection per backend, serving the waiters of every key.
#[derive(Debug)]
pub(crate) struct Notifier {
    releases: ReleaseFeed,
    listening: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Notifier {
    /// Starts the listener task; must be called inside a tokio runtime.
    pub(crate) fn start(pool: Pool<Postgres>, channel: String) -> Self {
        let releases = ReleaseFeed::new();
        let (listening_tx, listening) = watch::channel(false);
        let task = tokio::spawn(listen(pool, channel, releases.clone(), listening_tx));
        Notifier {
            releases,
            listening,
            task,
        }
    }

    /// A subscription for `key`, made once the listener is listening (or after a short
    /// wait for it, falling back to the poll).
    pub(crate) async fn subscribe(&self, key: &str) -> Box<dyn KeyWatch> {
        // Subscribed before waiting, so nothing sent from here on is missed.
        let watch = self.releases.watch(key);
        let mut listening = self.listening.clone();
        let _ = tokio::time::timeout(LISTEN_READY_WAIT, listening.wait_for(|ready| *ready)).await;
        watch
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
    releases: ReleaseFeed,
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
        releases.wake_all();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    releases.released(notification.payload());
                }
                // The connection was lost; the next call reconnects and re-listens.
                Ok(None) => {
                    releases.wake_all();
                }
                Err(err) => {
                    tracing::debug!(error = %err, "LISTEN connection broke; reconnecting");
                    releases.wake_all();
                    tokio::time::sleep(RELISTEN_PAUSE).await;
                    break;
                }
            }
        }
    }
}
