//! PostgreSQL, with waiters woken by LISTEN/NOTIFY.

use std::sync::OnceLock;
use std::time::Duration;

use lock_core::{
    backend::{KeyWatch, ReleaseFeed},
    Error, LockKey, Result,
};
use sqlx::postgres::{PgConnectOptions, PgListener, PgQueryResult};
use sqlx::{AssertSqlSafe, Pool, Postgres, Row, SqlSafeStr, SqlStr};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{channel, pool_options, server_options, sql_text, Ops, RowsAffected, SqlText};
use crate::config::SqlConfig;

pub(crate) const SQL: SqlText = sql_text!(
    "postgres",
    // statement_timestamp() is fixed for one statement (now() would be fixed for the
    // whole transaction, the same thing in autocommit); clock_timestamp() moves on.
    now_ms: "(extract(epoch FROM statement_timestamp()) * 1000)::bigint",
    clock_ms: "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
);

const NOTIFY: &str = include_str!("../../sql/postgres/notify.sql");
const DURABILITY: &str = include_str!("../../sql/postgres/durability.sql");

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

/// The connect options of every connection of the backend. `synchronous_commit=on`: a
/// grant (and the sequence value it used) is flushed before it is acknowledged, whatever
/// the role or database default, so a crash cannot hand a token out twice. The statement
/// time-out lets the server cancel what a caller gave up on.
pub(crate) fn connect_options(config: &SqlConfig) -> Result<PgConnectOptions> {
    let statement_timeout = config.statement_timeout.as_millis().to_string();
    Ok(
        server_options(config, "postgres", |options: PgConnectOptions, password| {
            options.password(password)
        })?
        .options([
            ("synchronous_commit", "on"),
            ("statement_timeout", statement_timeout.as_str()),
        ]),
    )
}

/// The lock operations' pool. No connection is opened yet.
pub(crate) fn pool(config: &SqlConfig, options: PgConnectOptions) -> Pool<Postgres> {
    pool_options(config).connect_lazy_with(options)
}

/// Refuses a database where tokens could repeat or go backwards: the session did not get
/// `synchronous_commit` (a pooler that drops startup options), or the token sequence was
/// made by someone else with a cache, a negative increment or cycling.
pub(crate) async fn check_durability(ops: &Ops<Postgres>, table: &str) -> Result<()> {
    let query = sqlx::query(AssertSqlSafe(DURABILITY.replace("{table}", table)).into_sql_str());
    let row = ops
        .fetch_row("checking the fencing sequence", query)
        .await?;
    let read = |err| crate::error::map(ops.dialect, "reading the fencing sequence", err);
    let synchronous: String = row.try_get(0).map_err(read)?;
    let cache: i64 = row.try_get(1).map_err(read)?;
    let increment: i64 = row.try_get(2).map_err(read)?;
    let cycles: bool = row.try_get(3).map_err(read)?;
    if synchronous == "off" {
        return Err(Error::misconfigured(
            "synchronous_commit is off on the lock connections although the backend asks \
             for on (a connection pooler that drops startup options?); grants and fencing \
             tokens could be lost in a crash and tokens handed out twice: connect directly \
             or let the pooler pass the `options` startup parameter",
        ));
    }
    if cache != 1 || increment <= 0 || cycles {
        return Err(Error::misconfigured(format!(
            "the fencing sequence {table}_tokens has CACHE {cache}, INCREMENT {increment}{}; \
             tokens would not grow in grant order across connections: run ALTER SEQUENCE \
             {table}_tokens CACHE 1 INCREMENT 1 NO CYCLE",
            if cycles { ", CYCLE" } else { "" }
        )));
    }
    Ok(())
}

/// The backend's shared LISTEN connection: a pool of its own with one connection, so it
/// never takes a slot from the lock operations (a `pool_size` of 1 works), started on
/// first use.
pub(crate) struct Listener {
    pool: Pool<Postgres>,
    channel: String,
    notify: SqlStr,
    notifier: OnceLock<Notifier>,
}

impl Listener {
    /// A listener for `table`'s channel; nothing is opened yet.
    pub(crate) fn new(config: &SqlConfig, options: PgConnectOptions) -> Self {
        Listener {
            pool: pool_options(config)
                .max_connections(1)
                .connect_lazy_with(options),
            channel: channel(&config.table),
            notify: AssertSqlSafe(NOTIFY.replace("{channel}", &channel(&config.table)))
                .into_sql_str(),
            notifier: OnceLock::new(),
        }
    }

    /// Tells the key's waiters, in every backend, that it was released. Sent after the
    /// release committed, in a statement of its own: a notification that fails (a full
    /// queue) leaves the waiters to their fallback poll instead of undoing the release.
    pub(crate) async fn released(&self, ops: &Ops<Postgres>, key: &LockKey) {
        let query = sqlx::query(self.notify.clone()).bind(key.as_str().to_owned());
        if let Err(err) = ops.fetch_row("notifying waiters", query).await {
            tracing::debug!(error = %err, "release notification failed; waiters poll");
        }
    }

    /// The shared notifier, started on the first call (inside a tokio runtime).
    pub(crate) fn notifier(&self) -> &Notifier {
        self.notifier
            .get_or_init(|| Notifier::start(self.pool.clone(), self.channel.clone()))
    }
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
    fn start(pool: Pool<Postgres>, channel: String) -> Self {
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
