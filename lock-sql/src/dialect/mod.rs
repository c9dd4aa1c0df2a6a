//! One lease-table design, many dialects: the SQL text per dialect, and the operations
//! written once over any sqlx database.

/// `impl<DB> Ops<DB> { ... }` with the sqlx bounds every dialect's operations need,
/// written once for the files that add operations (the lock table's, the holds table's,
/// lock sets).
macro_rules! ops_impl {
    ($($body:tt)*) => {
        impl<DB> Ops<DB>
        where
            DB: Database,
            <DB as Database>::Arguments: IntoArguments<DB>,
            for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
            for<'q> String: Encode<'q, DB> + Type<DB>,
            for<'q> i64: Encode<'q, DB>,
            for<'r> i64: Decode<'r, DB> + Type<DB>,
            for<'r> String: Decode<'r, DB>,
            for<'q> Vec<u8>: Encode<'q, DB> + Type<DB>,
            for<'q> Option<Vec<u8>>: Encode<'q, DB>,
            for<'r> Vec<u8>: Decode<'r, DB>,
            for<'r> Option<Vec<u8>>: Decode<'r, DB>,
            for<'q> Option<String>: Encode<'q, DB>,
            for<'r> Option<String>: Decode<'r, DB>,
            usize: ColumnIndex<DB::Row>,
            DB::QueryResult: RowsAffected,
        {
            $($body)*
        }
    };
}

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod sets;
mod shared;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(feature = "postgres")]
pub(crate) use shared::watch_name;
pub(crate) use shared::{hold_text, HoldText, Turn};

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use lock_core::backend::{with_timeout, HolderInfo, Ownership, Record};
use lock_core::{Error, ErrorKind, FencingToken, LeaseId, LockKey, Primitive, Result};
use sqlx::pool::PoolOptions;
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments};
use sqlx::{Pool, Row, SqlSafeStr, SqlStr, Type};

use crate::config::{Dialect, SqlConfig};
use crate::error::{into_error, lock_wait_timed_out, lost_a_deadlock};

/// How many times a statement chosen as a deadlock's victim is sent again before its
/// error is reported.
const DEADLOCK_RETRIES: usize = 3;

/// How long after the statement time-out a statement's answer may still arrive before its
/// connection is given up: the server's own cancellation needs a round trip to report.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Where the statement files of one dialect splice in the (validated) table name, the
/// notification channel and the database clock in milliseconds: `{now}` is constant
/// within one statement (whether a lease is over is judged once), `{clock}` is read when
/// evaluated (an expiry written after a lock wait counts from the write).
pub(crate) struct SqlText {
    pub migrate: &'static str,
    pub acquire: &'static str,
    pub renew: &'static str,
    /// Sets a live lease's expiry exactly, shorter or longer (`renew` never shortens).
    pub expire_in: &'static str,
    pub renew_many: &'static str,
    /// Which leases of a batch are live, for dialects whose `renew_many` cannot return
    /// the rows it renewed.
    pub renewed: Option<&'static str>,
    pub release: &'static str,
    pub inspect: &'static str,
    /// Live leases under a key prefix, in key order, for operators.
    pub list_held: &'static str,
    pub stored_keys: &'static str,
    pub expired: &'static str,
    pub sweep: &'static str,
    /// Idempotency records: the fenced upsert, the read, and their sweep.
    pub write_record: &'static str,
    pub read_record: &'static str,
    pub expired_records: &'static str,
    pub sweep_record: &'static str,
    /// The database server's clock at the statement's start, in integer milliseconds
    /// since the Unix epoch.
    pub now_ms: &'static str,
    /// The database server's clock when the expression is evaluated, in the same unit.
    pub clock_ms: &'static str,
    /// Semaphores and reader-writer locks (`sql/<dialect>/holds/`).
    pub holds: HoldText,
}

/// The [`SqlText`] of the dialect whose statement files live in `sql/<dir>/`.
macro_rules! sql_text {
    ($dir:literal, now_ms: $now:expr, clock_ms: $clock:expr, holds: $holds:expr) => {
        $crate::dialect::sql_text!(
            $dir, now_ms: $now, clock_ms: $clock, renewed: None, holds: $holds
        )
    };
    (
        $dir:literal,
        now_ms: $now:expr,
        clock_ms: $clock:expr,
        renewed: $renewed:expr,
        holds: $holds:expr
    ) => {
        $crate::dialect::SqlText {
            migrate: include_str!(concat!("../../sql/", $dir, "/migrate.sql")),
            acquire: include_str!(concat!("../../sql/", $dir, "/acquire.sql")),
            renew: include_str!(concat!("../../sql/", $dir, "/renew.sql")),
            expire_in: include_str!(concat!("../../sql/", $dir, "/expire_in.sql")),
            renew_many: include_str!(concat!("../../sql/", $dir, "/renew_many.sql")),
            renewed: $renewed,
            release: include_str!(concat!("../../sql/", $dir, "/release.sql")),
            inspect: include_str!(concat!("../../sql/", $dir, "/inspect.sql")),
            list_held: include_str!(concat!("../../sql/", $dir, "/list_held.sql")),
            stored_keys: include_str!(concat!("../../sql/", $dir, "/stored_keys.sql")),
            expired: include_str!(concat!("../../sql/", $dir, "/expired.sql")),
            sweep: include_str!(concat!("../../sql/", $dir, "/sweep.sql")),
            write_record: include_str!(concat!("../../sql/", $dir, "/write_record.sql")),
            read_record: include_str!(concat!("../../sql/", $dir, "/read_record.sql")),
            expired_records: include_str!(concat!("../../sql/", $dir, "/expired_records.sql")),
            sweep_record: include_str!(concat!("../../sql/", $dir, "/sweep_record.sql")),
            now_ms: $now,
            clock_ms: $clock,
            holds: $holds,
        }
    };
}
pub(crate) use sql_text;

/// Splits `migrate.sql` into statements run one after the other on one connection.
const STATEMENT_BREAK: &str = "-- statement";

/// Follows [`STATEMENT_BREAK`] before a statement that adds a column to a table made by
/// an older version, in a dialect without `ADD COLUMN IF NOT EXISTS` (SQLite): its
/// "duplicate column" error means the column is there already.
const IF_COLUMN_MISSING: &str = " if the column is missing";

/// One statement of `migrate.sql`.
#[derive(Clone, Debug)]
struct MigrateStep {
    sql: SqlStr,
    /// Whether a "duplicate column" error means the step was done before.
    adds_column: bool,
}

/// The statements of one dialect for one table, prepared once per backend.
#[derive(Debug)]
pub(crate) struct Statements {
    migrate: Vec<MigrateStep>,
    acquire: SqlStr,
    renew: SqlStr,
    expire_in: SqlStr,
    renew_many: SqlStr,
    renewed: Option<SqlStr>,
    release: SqlStr,
    inspect: SqlStr,
    list_held: SqlStr,
    stored_keys: SqlStr,
    expired: SqlStr,
    sweep: SqlStr,
    write_record: SqlStr,
    read_record: SqlStr,
    expired_records: SqlStr,
    sweep_record: SqlStr,
    holds: shared::HoldStatements,
}

impl Statements {
    /// `table` must have passed [`crate::config::validate_table`].
    pub(crate) fn new(text: &SqlText, table: &str) -> Self {
        let fill = |sql: &str| {
            AssertSqlSafe(
                sql.replace("{now}", text.now_ms)
                    .replace("{clock}", text.clock_ms)
                    .replace("{channel}", &channel(table))
                    .replace("{table}", table),
            )
            .into_sql_str()
        };
        Statements {
            migrate: text
                .migrate
                .split(STATEMENT_BREAK)
                .filter(|s| !s.trim().is_empty())
                .map(|step| match step.strip_prefix(IF_COLUMN_MISSING) {
                    Some(sql) => MigrateStep {
                        sql: fill(sql),
                        adds_column: true,
                    },
                    None => MigrateStep {
                        sql: fill(step),
                        adds_column: false,
                    },
                })
                .collect(),
            acquire: fill(text.acquire),
            renew: fill(text.renew),
            expire_in: fill(text.expire_in),
            renew_many: fill(text.renew_many),
            renewed: text.renewed.map(fill),
            release: fill(text.release),
            inspect: fill(text.inspect),
            list_held: fill(text.list_held),
            stored_keys: fill(text.stored_keys),
            expired: fill(text.expired),
            sweep: fill(text.sweep),
            write_record: fill(text.write_record),
            read_record: fill(text.read_record),
            expired_records: fill(text.expired_records),
            sweep_record: fill(text.sweep_record),
            holds: shared::HoldStatements::new(&text.holds, &fill),
        }
    }

    /// The statement `mutex` picks for a mutex key, or `shared` picks for a semaphore or
    /// reader-writer key.
    fn pick(
        &self,
        key: &LockKey,
        mutex: impl FnOnce(&Self) -> &SqlStr,
        shared: impl FnOnce(&shared::HoldStatements) -> &SqlStr,
    ) -> SqlStr {
        match key.primitive() {
            Primitive::Mutex => mutex(self),
            _ => shared(&self.holds),
        }
        .clone()
    }

    /// The statements as sent (for the benchmark's raw baseline and tests).
    pub(crate) fn acquire_sql(&self) -> &str {
        self.acquire.as_str()
    }

    pub(crate) fn release_sql(&self) -> &str {
        self.release.as_str()
    }
}

/// The PostgreSQL notification channel of a table.
pub(crate) fn channel(table: &str) -> String {
    format!("{table}_released")
}

/// The count of rows a statement changed (matched, for MySQL), which every driver
/// reports through an inherent method of its own.
pub(crate) trait RowsAffected {
    fn rows(&self) -> u64;
}

/// A statement run on a borrowed connection.
type Statement<'c, T> = Pin<Box<dyn Future<Output = sqlx::Result<T>> + Send + 'c>>;

/// The lock operations over one pool; generic so each is written once for all dialects.
pub(crate) struct Ops<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: Statements,
    pub(crate) dialect: Dialect,
    /// How long a statement's answer is awaited before its connection is given up.
    pub(crate) answer_within: Duration,
    /// The database file (SQLite), to explain a file that cannot be opened.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    file: Option<String>,
}

ops_impl! {
    /// The operations for `config`'s statement time-out over `pool`.
    pub(crate) fn new(pool: Pool<DB>, text: &SqlText, config: &SqlConfig) -> Self {
        Ops {
            pool,
            sql: Statements::new(text, &config.table),
            dialect: config.dialect(),
            answer_within: config.statement_timeout + ANSWER_GRACE,
            file: config.file().map(str::to_owned),
        }
    }

    fn fail(&self, doing: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |err| into_error(err, &doing, self.dialect)
    }

    /// Maps a failure to open a connection; a SQLite file that cannot be opened for a
    /// reason retrying cannot mend (its directory is missing) says so instead of
    /// "unreachable".
    fn connect_failed(&self, doing: &str, err: sqlx::Error) -> Error {
        let doing = format!("{doing} (connecting)");
        #[cfg(feature = "sqlite")]
        if let Some(why) = self
            .file
            .as_deref()
            .and_then(|file| sqlite::cannot_open(file, &err))
        {
            return Error::new(ErrorKind::Misconfigured, format!("{doing} failed: {why}"))
                .with_source(err);
        }
        into_error(err, &doing, self.dialect)
    }

    /// Runs `statement` on a pooled connection, awaiting its answer for at most the
    /// statement time-out plus a grace.
    ///
    /// A connection whose statement failed or went unanswered is closed rather than
    /// returned: its state (an open transaction, a held named lock, a reply still on its
    /// way through a partition) is unknown, and returning it would make the pool's
    /// unbounded health check wait on it, holding the slot for ever.
    async fn on_connection<T, F>(&self, doing: &str, statement: F) -> Result<T>
    where
        F: for<'c> FnOnce(&'c mut DB::Connection) -> Statement<'c, T>,
    {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|err| self.connect_failed(doing, err))?;
        let answer = with_timeout(self.dialect.name(), self.answer_within, doing, async {
            statement(&mut conn)
                .await
                .map_err(|err| into_error(err, doing, self.dialect))
        })
        .await;
        if answer.is_err() {
            drop(conn.detach());
        }
        answer
    }

    /// Creates the table and the token counter if missing, on one connection, inside the
    /// dialect's own serialisation (a transaction or a named lock).
    pub(crate) async fn migrate(&self) -> Result<()> {
        let statements = self.sql.migrate.clone();
        self.on_connection("creating the lock table", move |conn| {
            Box::pin(async move {
                for step in statements {
                    match sqlx::raw_sql(step.sql).execute(&mut *conn).await {
                        Err(sqlx::Error::Database(db))
                            if step.adds_column && db.message().contains("duplicate column") => {}
                        done => drop(done?),
                    }
                }
                Ok(())
            })
        })
        .await
    }

    /// Grants the key to `lease_id` for `ttl_ms` if it is free, expired or already the
    /// lease's own, labelled `holder`; `None` when another lease holds it.
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
        holder: Option<String>,
    ) -> Result<Option<FencingToken>> {
        let query = self.acquire_query(key, lease_id, ttl_ms, holder);
        let dialect = self.dialect;
        let row = self
            .on_connection("acquire", move |conn| {
                Box::pin(Self::acquire_on(conn, query, dialect))
            })
            .await?;
        granted::<DB>(dialect, row, lease_id)
    }

    /// The acquire statement (acquire.sql) for one key, bound and ready to run alone or
    /// inside a transaction of several keys.
    pub(crate) fn acquire_query(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
        holder: Option<String>,
    ) -> sqlx::query::Query<'static, DB, <DB as Database>::Arguments> {
        sqlx::query(self.sql.acquire.clone())
            .bind(key.as_str().to_owned())
            .bind(lease_id.to_string())
            .bind(ttl_ms)
            .bind(holder)
    }

    /// Runs an [`acquire_query`](Self::acquire_query) on `conn`: the grant's row (read
    /// with [`granted`]), or `None` when the key is contended.
    pub(crate) async fn acquire_on(
        conn: &mut DB::Connection,
        query: sqlx::query::Query<'static, DB, <DB as Database>::Arguments>,
        dialect: Dialect,
    ) -> sqlx::Result<Option<DB::Row>> {
        match query.fetch_optional(conn).await {
            // Another transaction is writing the key's row (or drawing a token) and did
            // not finish within the statement's short lock wait: the key is contended,
            // and nothing was written.
            Err(err) if lock_wait_timed_out(dialect, &err) => {
                tracing::debug!(%err, "acquire gave up waiting for a row lock");
                Ok(None)
            }
            answer => answer,
        }
    }

    pub(crate) async fn renew(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
    ) -> Result<Ownership> {
        let statement = self.sql.pick(key, |sql| &sql.renew, |holds| &holds.renew);
        self.set_expiry("renew", statement, key, lease_id, ttl_ms)
            .await
    }

    /// Sets the live lease's expiry to exactly `ttl_ms` from now, even if sooner.
    pub(crate) async fn expire_in(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
    ) -> Result<Ownership> {
        let statement = self
            .sql
            .pick(key, |sql| &sql.expire_in, |holds| &holds.expire_in);
        self.set_expiry("expire_in", statement, key, lease_id, ttl_ms)
            .await
    }

    async fn set_expiry(
        &self,
        what: &'static str,
        statement: SqlStr,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
    ) -> Result<Ownership> {
        let query = bind_key(sqlx::query(statement).bind(ttl_ms), key).bind(lease_id.to_string());
        let done = self
            .on_connection(what, move |conn| Box::pin(query.execute(conn)))
            .await?;
        // MySQL reports matched rather than changed rows (CLIENT_FOUND_ROWS), which is
        // what this needs: the WHERE clause is the whole condition.
        Ok(Ownership::held_if(done.rows() == 1))
    }

    /// Renews a batch of leases (key, lease id, TTL in milliseconds) with one statement
    /// for the mutexes' and, when the batch has any, one for the shared holds'; answers,
    /// in the batch's order, whether each was live and is renewed.
    pub(crate) async fn renew_many(
        &self,
        batch: &[(LockKey, LeaseId, i64)],
    ) -> Result<Vec<Ownership>> {
        let (mutexes, shared): (Vec<_>, Vec<_>) = batch
            .iter()
            .cloned()
            .partition(|(key, _, _)| key.primitive() == Primitive::Mutex);
        let mut renewed = HashSet::new();
        if !mutexes.is_empty() {
            let sql = (&self.sql.renew_many, self.sql.renewed.as_ref());
            renewed.extend(self.renew_batch(&mutexes, sql).await?);
        }
        if !shared.is_empty() {
            let sql = (&self.sql.holds.renew_many, self.sql.holds.renewed.as_ref());
            renewed.extend(self.renew_batch(&shared, sql).await?);
        }
        Ok(batch
            .iter()
            .map(|(key, lease, _)| Ownership::held_if(renewed.contains(&identity(key, *lease))))
            .collect())
    }

    /// Renews `batch` with the statement `renew_many` and answers the identities
    /// ([`identity`]) of the leases it renewed; `renewed` asks which those were, for
    /// dialects whose `renew_many` only counts them.
    async fn renew_batch(
        &self,
        batch: &[(LockKey, LeaseId, i64)],
        (renew_many, renewed): (&SqlStr, Option<&SqlStr>),
    ) -> Result<HashSet<LeaseIdentity>> {
        let leases = batch_json(batch);
        let Some(renewed) = renewed else {
            return self
                .leases_of("renewing leases", renew_many.clone(), leases)
                .await;
        };
        let query = sqlx::query(renew_many.clone()).bind(leases.clone());
        let done = self
            .on_connection("renewing leases", move |conn| Box::pin(query.execute(conn)))
            .await?;
        // Matched rows (see `renew`): all renewed, the usual case, costs no second
        // statement.
        if usize::try_from(done.rows()) == Ok(batch.len()) {
            return Ok(batch
                .iter()
                .map(|(key, lease, _)| identity(key, *lease))
                .collect());
        }
        self.leases_of("finding the renewed leases", renewed.clone(), leases)
            .await
    }

    /// Runs `sql` with the batch `leases` and collects the leases it answers: rows of key,
    /// lease id and, for shared holds, the primitive.
    async fn leases_of(
        &self,
        doing: &str,
        sql: SqlStr,
        leases: String,
    ) -> Result<HashSet<LeaseIdentity>> {
        let query = sqlx::query(sql).bind(leases);
        let rows = self
            .on_connection(doing, move |conn| Box::pin(query.fetch_all(conn)))
            .await?;
        rows.iter()
            .map(|row| {
                let primitive = if row.len() > 2 {
                    row.try_get(2)?
                } else {
                    String::new()
                };
                Ok((row.try_get(0)?, row.try_get(1)?, primitive))
            })
            .collect::<sqlx::Result<_>>()
            .map_err(self.fail("reading the renewed leases"))
    }

    /// Deletes the lease's row, live or expired (of a shared key: its hold or its writer
    /// intent): `None` if there was none, else whether it was a live hold.
    pub(crate) async fn release(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
    ) -> Result<Option<Ownership>> {
        let mut victim = 0;
        let row = loop {
            let statement = self
                .sql
                .pick(key, |sql| &sql.release, |holds| &holds.release);
            let query = bind_key(sqlx::query(statement), key).bind(lease_id.to_string());
            match self
                .on_connection("release", move |conn| Box::pin(query.fetch_optional(conn)))
                .await
            {
                // A release that a concurrent transaction (a lock set's, a batch of
                // renewals) made a deadlock's victim wrote nothing: it is sent again at
                // once rather than reported as an outage of a store that answers.
                Err(err) if victim < DEADLOCK_RETRIES && lost_a_deadlock(self.dialect, &err) => {
                    victim += 1;
                }
                row => break row?,
            }
        };
        row.map(|row| {
            let live: i64 = row.try_get(0).map_err(self.fail("reading the release"))?;
            Ok(Ownership::held_if(live == 1))
        })
        .transpose()
    }

    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        if key.primitive() != Primitive::Mutex {
            return Ok(self.holders(key).await?.into_iter().next());
        }
        let query = sqlx::query(self.sql.inspect.clone()).bind(key.as_str().to_owned());
        let row = self
            .on_connection("inspect", move |conn| Box::pin(query.fetch_optional(conn)))
            .await?;
        row.map(|row| self.holder_at(&row, 0)).transpose()
    }

    /// The holder told by the columns lease id, token, remaining milliseconds and label,
    /// from column `first` on (inspect.sql's columns, which list_held.sql repeats).
    fn holder_at(&self, row: &DB::Row, first: usize) -> Result<HolderInfo> {
        let read = self.fail("reading the holder");
        let (lease, token, remaining, holder): (String, i64, i64, Option<String>) = (|| {
            Ok::<_, sqlx::Error>((
                row.try_get(first)?,
                row.try_get(first + 1)?,
                row.try_get(first + 2)?,
                row.try_get(first + 3)?,
            ))
        })()
        .map_err(read)?;
        Ok(HolderInfo {
            lease_id: lease.parse()?,
            token: token_from(token)?,
            remaining_ttl: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
            waiters: None,
            holder,
            kind: lock_core::HoldKind::Mutex,
        })
    }

    /// Live leases whose key starts with `prefix`, at most `limit`, in key order.
    pub(crate) async fn list_held(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockKey, HolderInfo)>> {
        let above = prefix_successor(prefix);
        let mut query = sqlx::query(self.sql.list_held.clone())
            .bind(prefix.to_owned())
            .bind(above.clone());
        // MariaDB's positional parameters are bound once per occurrence.
        if self.dialect == Dialect::MySql {
            query = query.bind(above);
        }
        let query = query.bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = self
            .on_connection("listing held keys", move |conn| {
                Box::pin(query.fetch_all(conn))
            })
            .await?;
        rows.iter()
            .map(|row| {
                let key: String = row.try_get(0).map_err(self.fail("reading a key"))?;
                Ok((LockKey::new(key)?, self.holder_at(row, 1)?))
            })
            .collect()
    }

    /// Keys with a lock row or a shared-hold row, each once.
    pub(crate) async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut query = sqlx::query(self.sql.stored_keys.clone()).bind(prefix.to_owned());
        // MariaDB's positional parameters are bound once per occurrence.
        if self.dialect == Dialect::MySql {
            query = query.bind(prefix.to_owned());
        }
        let rows = self
            .on_connection("listing keys", move |conn| Box::pin(query.fetch_all(conn)))
            .await?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(self.fail("reading a key")))
            .collect()
    }

    /// Deletes expired rows (of crashed holders) that nobody took over since, and
    /// records past their retention that were not overwritten, up to a thousand of each
    /// per call.
    pub(crate) async fn sweep(&self) -> Result<u64> {
        let leases = self
            .sweep_rows("leases", &self.sql.expired, &self.sql.sweep)
            .await?;
        let records = self
            .sweep_rows("records", &self.sql.expired_records, &self.sql.sweep_record)
            .await?;
        let holds = self
            .sweep_rows(
                "shared holds",
                &self.sql.holds.expired,
                &self.sql.holds.sweep,
            )
            .await?;
        Ok(leases + records + holds)
    }

    /// Finds expired rows with `expired`, a plain read, and deletes them one by one with
    /// `delete` (which checks the expiry again), so the sweep locks only rows it deletes: a
    /// scanning delete locks (and waits for) the live rows it passes on MariaDB. `delete`
    /// takes a row's identity as `expired` answers it, column by column (all text).
    async fn sweep_rows(&self, what: &str, expired: &SqlStr, delete: &SqlStr) -> Result<u64> {
        let query = sqlx::query(expired.clone());
        let rows = self
            .on_connection(&format!("listing expired {what}"), move |conn| {
                Box::pin(query.fetch_all(conn))
            })
            .await?;
        let mut swept = 0;
        for row in rows {
            let mut query = sqlx::query(delete.clone());
            for column in 0..row.len() {
                let part: String = row.try_get(column).map_err(self.fail("reading a key"))?;
                query = query.bind(part);
            }
            swept += self
                .on_connection(&format!("sweeping expired {what}"), move |conn| {
                    Box::pin(query.execute(conn))
                })
                .await?
                .rows();
        }
        Ok(swept)
    }

    /// Stores `record` for `key` for `retention_ms`, only while `lease_id` holds the key
    /// (one statement: write_record.sql); `false`, writing nothing, when it does not.
    pub(crate) async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention_ms: i64,
    ) -> Result<Ownership> {
        let token = i64::try_from(record.token.get()).map_err(|_| {
            Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "fencing token {} does not fit the record table",
                    record.token
                ),
            )
        })?;
        let query = sqlx::query(self.sql.write_record.clone())
            .bind(record.value.clone())
            .bind(record.fingerprint.clone())
            .bind(token)
            .bind(retention_ms)
            .bind(key.as_str().to_owned())
            .bind(lease_id.to_string());
        let done = self
            .on_connection("writing a record", move |conn| {
                Box::pin(query.execute(conn))
            })
            .await?;
        // MariaDB counts an upsert that replaced a row as 2 (and one that changed nothing,
        // writing the same record again, as 1 with matched rows): any count means written.
        Ok(Ownership::held_if(done.rows() > 0))
    }

    /// The record of `key` within its retention.
    pub(crate) async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        let query = sqlx::query(self.sql.read_record.clone()).bind(key.as_str().to_owned());
        let row = self
            .on_connection("reading a record", move |conn| {
                Box::pin(query.fetch_optional(conn))
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let (value, fingerprint, token): (Vec<u8>, Option<Vec<u8>>, i64) =
            (|| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))()
                .map_err(self.fail("reading the record"))?;
        Ok(Some(Record {
            value,
            fingerprint,
            token: token_from(token)?,
        }))
    }

    /// Runs a statement of one dialect's own (a check, a notification) within the same
    /// bounds as the lock operations; it must return one row.
    #[cfg(feature = "postgres")]
    pub(crate) async fn fetch_row(
        &self,
        doing: &str,
        query: sqlx::query::Query<'static, DB, <DB as Database>::Arguments>,
    ) -> Result<DB::Row> {
        self.on_connection(doing, move |conn| Box::pin(query.fetch_one(conn)))
            .await
    }
}

/// Reads the answer of acquire.sql for `lease_id` ([`Ops::acquire_on`]): its token when
/// the lease holds the key now, `None` when another lease does.
pub(crate) fn granted<DB: Database>(
    dialect: Dialect,
    row: Option<DB::Row>,
    lease_id: LeaseId,
) -> Result<Option<FencingToken>>
where
    usize: ColumnIndex<DB::Row>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
{
    let Some(row) = row else {
        return Ok(None);
    };
    let (holder, token, remaining): (String, i64, i64) =
        (|| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))()
            .map_err(|err| into_error(err, "reading the grant", dialect))?;
    // Dialects whose upsert cannot filter its RETURNING (MariaDB) return whoever holds
    // the row; the grant is ours only if the lease id is.
    if holder != lease_id.to_string() {
        return Ok(None);
    }
    if remaining <= 0 {
        // Only where the expiry is computed before a wait (MariaDB's insert waits for the
        // token counter after computing it): the grant is over already, so it counts as
        // unanswered and the caller retries the same lease.
        return Err(Error::new(
            ErrorKind::Unavailable,
            "acquire failed: the grant was written after its TTL had run out (the \
             statement waited on a lock for longer than the TTL)",
        ));
    }
    Ok(Some(token_from(token)?))
}

/// A batch of leases as the JSON array the dialects' `renew_many.sql` read:
/// `[{"k": key, "p": primitive, "l": lease id, "t": TTL in ms}, ...]` (the mutexes' ignore
/// `p`). One parameter whatever the batch's size, so each dialect has one statement text
/// for every batch.
fn batch_json(batch: &[(LockKey, LeaseId, i64)]) -> String {
    let mut json = String::from("[");
    for (n, (key, lease, ttl_ms)) in batch.iter().enumerate() {
        if n > 0 {
            json.push(',');
        }
        json.push_str("{\"k\":\"");
        for c in key.as_str().chars() {
            match c {
                '"' | '\\' => {
                    json.push('\\');
                    json.push(c);
                }
                // Keys have none, but the text must be valid JSON whatever it holds.
                c if c.is_control() => json.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => json.push(c),
            }
        }
        json.push_str(&format!(
            "\",\"p\":\"{}\",\"l\":\"{lease}\",\"t\":{ttl_ms}}}",
            key.primitive().name()
        ));
    }
    json.push(']');
    json
}

/// The least text above every text that starts with `prefix` (in code point order, which
/// is UTF-8 byte order), `None` when no text is (an empty prefix, or one of only
/// `char::MAX`): the last character that can grow is replaced by its successor.
fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // `char::from_u32` refuses surrogates; the next scalar value above them is U+E000.
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Tokens are stored as signed 64-bit integers (the widest every dialect has) and start
/// at 1, so a negative one means the table was tampered with.
fn token_from(token: i64) -> Result<FencingToken> {
    u64::try_from(token).map(FencingToken::new).map_err(|_| {
        Error::new(
            ErrorKind::Internal,
            format!("the lock table holds a negative fencing token ({token})"),
        )
    })
}

/// A lease as the renewal statements answer it: key, lease id, and the primitive's name
/// for a shared hold (empty for a mutex, whose table has no such column).
type LeaseIdentity = (String, String, String);

fn identity(key: &LockKey, lease: LeaseId) -> LeaseIdentity {
    let primitive = match key.primitive() {
        Primitive::Mutex => "",
        other => other.name(),
    };
    (
        key.as_str().to_owned(),
        lease.to_string(),
        primitive.to_owned(),
    )
}

/// Binds `key` as the statements of its table take it: the key, then for a shared key its
/// primitive (the holds table's rows are found by both).
fn bind_key<DB: Database>(
    query: sqlx::query::Query<'static, DB, <DB as Database>::Arguments>,
    key: &LockKey,
) -> sqlx::query::Query<'static, DB, <DB as Database>::Arguments>
where
    for<'q> String: Encode<'q, DB> + Type<DB>,
{
    let query = query.bind(key.as_str().to_owned());
    match key.primitive() {
        Primitive::Mutex => query,
        shared => query.bind(shared.name().to_owned()),
    }
}

/// A server dialect's connect options, built from the parsed URL: the driver parses a
/// URL rebuilt without the password (so neither its errors nor anything it logs can
/// show it), and `with_password` then sets the password as it was decoded.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn server_options<O: std::str::FromStr<Err = sqlx::Error>>(
    config: &SqlConfig,
    scheme: &str,
    with_password: impl FnOnce(O, &str) -> O,
) -> Result<O> {
    let (url, password) = config
        .server()
        .ok_or_else(|| Error::new(ErrorKind::Internal, "a server dialect without a URL"))?;
    let refused = |why: &str| url.error(why);
    let [host] = url.hosts() else {
        return Err(refused("exactly one host is needed"));
    };
    let mut driver = url::Url::parse(&format!("{scheme}://{}", host.host))
        .map_err(|_| refused("the host is not valid"))?;
    driver
        .set_port(host.port)
        .and_then(|()| driver.set_username(url.username()))
        .map_err(|()| refused("the host cannot have a port or user name"))?;
    if !url.path().is_empty() {
        driver.set_path(url.path());
    }
    if !url.query().is_empty() {
        driver.query_pairs_mut().extend_pairs(url.query());
    }
    let options = O::from_str(driver.as_str())
        .map_err(|err| refused("the driver refused an option").with_source(err))?;
    Ok(match password {
        Some(password) => with_password(options, password),
        None => options,
    })
}

/// The pool settings every dialect shares: size and connect time-out. No connection is
/// opened until one is needed.
pub(crate) fn pool_options<DB: Database>(config: &SqlConfig) -> PoolOptions<DB> {
    PoolOptions::<DB>::new()
        .max_connections(config.pool_size)
        .acquire_timeout(config.connect_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_json_whatever_its_keys_hold() {
        let lease = LeaseId::from_u128(0xab);
        let key = LockKey::new("a\"b\\c/é🔒").expect("a valid key");
        assert_eq!(
            batch_json(&[(key, lease, 1500)]),
            format!(r#"[{{"k":"a\"b\\c/é🔒","p":"mutex","l":"{lease}","t":1500}}]"#)
        );
        assert_eq!(batch_json(&[]), "[]");
    }

    #[test]
    fn the_successor_bounds_exactly_the_texts_with_the_prefix() {
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("ops/"), Some("ops0".to_owned()));
        assert_eq!(prefix_successor("a%_"), Some("a%`".to_owned()));
        assert_eq!(prefix_successor("a\u{d7ff}"), Some("a\u{e000}".to_owned()));
        assert_eq!(prefix_successor("a\u{10ffff}"), Some("b".to_owned()));
        assert_eq!(prefix_successor("\u{10ffff}\u{10ffff}"), None);
        let prefix = "k/é\u{7f}";
        let above = prefix_successor(prefix).expect("a successor");
        for key in ["k/é\u{7f}", "k/é\u{7f}\u{10ffff}", "k/é\u{7f}zz"] {
            assert!(prefix <= key && key < above.as_str(), "{key:?}");
        }
        for key in ["k/é", "k/é\u{80}", "k/ê", "l"] {
            assert!(!(prefix <= key && key < above.as_str()), "{key:?}");
        }
    }
}
