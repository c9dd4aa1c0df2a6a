//! One lease-table design, many dialects: the SQL text per dialect, and the operations
//! written once over any sqlx database.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

use std::time::Duration;

use lock_core::{Error, ErrorKind, FencingToken, LeaseId, LockInfo, LockKey, Result};
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments};
use sqlx::{Pool, Row, SqlSafeStr, SqlStr, Type};

use crate::config::{Dialect, SqlConfig};
use crate::error::map;

/// Where the statement files of one dialect splice in the (validated) table name, the
/// notification channel and the database clock in milliseconds.
pub(crate) struct SqlText {
    pub migrate: &'static str,
    pub acquire: &'static str,
    pub renew: &'static str,
    pub release: &'static str,
    pub inspect: &'static str,
    pub stored_keys: &'static str,
    pub sweep: &'static str,
    /// An expression for the database server's clock, in integer milliseconds since the
    /// Unix epoch, constant within one statement.
    pub now_ms: &'static str,
}

/// The [`SqlText`] of the dialect whose statement files live in `sql/<dir>/`.
macro_rules! sql_text {
    ($dir:literal, now_ms: $now:expr) => {
        $crate::dialect::SqlText {
            migrate: include_str!(concat!("../../sql/", $dir, "/migrate.sql")),
            acquire: include_str!(concat!("../../sql/", $dir, "/acquire.sql")),
            renew: include_str!(concat!("../../sql/", $dir, "/renew.sql")),
            release: include_str!(concat!("../../sql/", $dir, "/release.sql")),
            inspect: include_str!(concat!("../../sql/", $dir, "/inspect.sql")),
            stored_keys: include_str!(concat!("../../sql/", $dir, "/stored_keys.sql")),
            sweep: include_str!(concat!("../../sql/", $dir, "/sweep.sql")),
            now_ms: $now,
        }
    };
}
pub(crate) use sql_text;

/// Splits `migrate.sql` files into statements.
const STATEMENT_BREAK: &str = "-- statement";

/// The statements of one dialect for one table, prepared once per backend.
#[derive(Debug)]
pub(crate) struct Statements {
    migrate: Vec<SqlStr>,
    acquire: SqlStr,
    renew: SqlStr,
    release: SqlStr,
    inspect: SqlStr,
    stored_keys: SqlStr,
    sweep: SqlStr,
}

impl Statements {
    /// `table` must have passed [`crate::config::validate_table`].
    pub(crate) fn new(text: &SqlText, table: &str) -> Self {
        let fill = |sql: &str| {
            AssertSqlSafe(
                sql.replace("{now}", text.now_ms)
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
                .map(fill)
                .collect(),
            acquire: fill(text.acquire),
            renew: fill(text.renew),
            release: fill(text.release),
            inspect: fill(text.inspect),
            stored_keys: fill(text.stored_keys),
            sweep: fill(text.sweep),
        }
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

/// The lock operations over one pool; generic so each is written once for all dialects.
#[derive(Debug)]
pub(crate) struct Ops<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: Statements,
    pub(crate) dialect: Dialect,
}

impl<DB> Ops<DB>
where
    DB: Database,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB>,
    usize: ColumnIndex<DB::Row>,
    DB::QueryResult: RowsAffected,
{
    fn fail(&self, doing: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |err| map(self.dialect, &doing, err)
    }

    /// Creates the table and the token counter if missing, on one connection, inside the
    /// dialect's own serialisation (a transaction or a named lock).
    pub(crate) async fn migrate(&self) -> Result<()> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(self.fail("connecting to migrate"))?;
        for statement in &self.sql.migrate {
            if let Err(err) = sqlx::raw_sql(statement.clone()).execute(&mut *conn).await {
                // Never hand back a connection with a half-done transaction or a held
                // named lock.
                drop(conn.detach());
                return Err(map(self.dialect, "creating the lock table", err));
            }
        }
        Ok(())
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
    ) -> Result<Option<FencingToken>> {
        let lease = lease_id.to_string();
        let row = sqlx::query(self.sql.acquire.clone())
            .bind(key.as_str())
            .bind(lease.clone())
            .bind(ttl_ms)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.fail("acquire"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        // Dialects whose upsert cannot filter its RETURNING (MariaDB) return whoever
        // holds the row; the grant is ours only if the lease id is.
        let holder: String = row.try_get(0).map_err(self.fail("reading the grant"))?;
        if holder != lease {
            return Ok(None);
        }
        let token: i64 = row.try_get(1).map_err(self.fail("reading the grant"))?;
        Ok(Some(token_from(token)?))
    }

    pub(crate) async fn renew(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
    ) -> Result<bool> {
        let done = sqlx::query(self.sql.renew.clone())
            .bind(ttl_ms)
            .bind(key.as_str())
            .bind(lease_id.to_string())
            .execute(&self.pool)
            .await
            .map_err(self.fail("renew"))?;
        // MySQL reports matched rather than changed rows (CLIENT_FOUND_ROWS), which is
        // what this needs: the WHERE clause is the whole condition.
        Ok(done.rows() == 1)
    }

    /// Deletes the lease's row, live or expired; `true` only if it was live.
    pub(crate) async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
        let row = sqlx::query(self.sql.release.clone())
            .bind(key.as_str())
            .bind(lease_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(self.fail("release"))?;
        match row {
            Some(row) => {
                let live: i64 = row.try_get(0).map_err(self.fail("reading the release"))?;
                Ok(live == 1)
            }
            None => Ok(false),
        }
    }

    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let row = sqlx::query(self.sql.inspect.clone())
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(self.fail("inspect"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = self.fail("reading the holder");
        let (lease, token, remaining): (String, i64, i64) =
            (|| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))()
                .map_err(read)?;
        Ok(Some(LockInfo {
            lease_id: lease.parse()?,
            token: token_from(token)?,
            remaining_ttl: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
            waiters: None,
        }))
    }

    pub(crate) async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(self.sql.stored_keys.clone())
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(self.fail("listing keys"))?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(self.fail("reading a key")))
            .collect()
    }

    /// Deletes expired rows (of crashed holders) that nobody took over since.
    pub(crate) async fn sweep(&self) -> Result<u64> {
        let done = sqlx::query(self.sql.sweep.clone())
            .execute(&self.pool)
            .await
            .map_err(self.fail("sweeping expired leases"))?;
        Ok(done.rows())
    }
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

/// Parses the configured URL as a driver's connect options; a malformed URL is invalid
/// input, shown without its password.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn url_options<O: std::str::FromStr<Err = sqlx::Error>>(
    config: &SqlConfig,
    database: &str,
) -> Result<O> {
    O::from_str(config.target()).map_err(|err| {
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "invalid {database} URL {}",
                lock_core::redact_url(config.target())
            ),
        )
        .with_source(err)
    })
}

/// A pool of the configured size and connect time-out. No connection is opened yet.
pub(crate) fn lazy_pool<DB: Database>(
    config: &SqlConfig,
    options: <DB::Connection as sqlx::Connection>::Options,
) -> Pool<DB> {
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(config.pool_size)
        .acquire_timeout(config.connect_timeout)
        .connect_lazy_with(options)
}
