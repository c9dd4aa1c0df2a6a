//! PostgreSQL, with waiters woken by LISTEN/NOTIFY.

use std::sync::OnceLock;

use lock_core::backend::{supervise_listener, KeyWatch, ListenerLink, ListenerTask, ReleaseFeed};
use lock_core::{Error, LockKey, Result};
use sqlx::postgres::{PgConnectOptions, PgListener, PgQueryResult};
use sqlx::{AssertSqlSafe, Pool, Postgres, Row, SqlSafeStr, SqlStr};

use super::{
    channel, hold_text, pool_options, server_options, sql_text, Ops, RowsAffected, SqlText, Turn,
};
use crate::config::{Dialect, SqlConfig};
use crate::error::into_error;

pub(crate) const SQL: SqlText = sql_text!(
    "postgres",
    // statement_timestamp() is fixed for one statement (now() would be fixed for the
    // whole transaction, the same thing in autocommit); clock_timestamp() moves on.
    now_ms: "(extract(epoch FROM statement_timestamp()) * 1000)::bigint",
    clock_ms: "(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    holds: hold_text!(
        "postgres",
        begin: "BEGIN",
        turn: Turn::Key(include_str!("../../sql/postgres/holds/turn.sql")),
        renewed: None
    )
);

const NOTIFY: &str = include_str!("../../sql/postgres/notify.sql");
const DURABILITY: &str = include_str!("../../sql/postgres/durability.sql");

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
    let read = |err| crate::error::into_error(err, "reading the fencing sequence", ops.dialect);
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
        let query = sqlx::query(self.notify.clone()).bind(super::watch_name(key));
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

/// One LISTEN connection per backend, serving the waiters of every key; the core's
/// supervisor reconnects it and wakes every waiter when it was down.
#[derive(Debug)]
pub(crate) struct Notifier {
    releases: ReleaseFeed,
    _listener: ListenerTask,
}

impl Notifier {
    /// Starts the listener; must be called inside a tokio runtime.
    fn start(pool: Pool<Postgres>, channel: String) -> Self {
        let releases = ReleaseFeed::new();
        let listener = supervise_listener("postgres LISTEN", releases.clone(), move |link| {
            listen(pool.clone(), channel.clone(), link)
        });
        Notifier {
            releases,
            _listener: listener,
        }
    }

    /// A subscription for `key`. A watch made before the LISTEN is in place is woken to
    /// look again when it comes up, so no release in between is missed.
    pub(crate) fn subscribe(&self, key: &str) -> Box<dyn KeyWatch> {
        self.releases.watch(key)
    }
}

/// One run of the listener: LISTEN on a new connection, then hand every notification (its
/// payload is the released key) to the feed until the connection fails.
async fn listen(pool: Pool<Postgres>, channel: String, link: ListenerLink) -> Result<()> {
    let failed = |doing: &'static str| move |err| into_error(err, doing, Dialect::Postgres);
    let mut listener = PgListener::connect_with(&pool)
        .await
        .map_err(failed("opening the LISTEN connection"))?;
    // A lost connection ends this run and the supervisor starts the next one, which wakes
    // every waiter; re-established inside the listener, the gap would go unnoticed.
    listener.eager_reconnect(false);
    listener
        .listen(&channel)
        .await
        .map_err(failed("listening for releases"))?;
    // Waiters already watching look again; those that subscribe from now on need not.
    link.subscribed();
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                let name = notification.payload();
                if super::shared::releases_many(name) {
                    link.feed().released_to_many(name);
                } else {
                    link.feed().released(name);
                }
            }
            Ok(None) => return Ok(()),
            Err(err) => return Err(failed("receiving release notifications")(err)),
        }
    }
}
