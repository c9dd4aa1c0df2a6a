//! MariaDB (10.5 or newer, for `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`).

use lock_core::Result;
use sqlx::mysql::{MySqlConnectOptions, MySqlQueryResult};
use sqlx::{AssertSqlSafe, Executor, MySql, Pool};

use super::{hold_text, pool_options, server_options, sql_text, RowsAffected, SqlText, Turn};
use crate::config::SqlConfig;

pub(crate) const SQL: SqlText = sql_text!(
    "mysql",
    // The session time zone is pinned to UTC (below), so these are unambiguous. NOW(3) is
    // fixed for one statement; SYSDATE(3) is read when evaluated (unless the server runs
    // with --sysdate-is-now).
    now_ms: "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
    clock_ms: "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)",
    // MariaDB's UPDATE cannot return the rows it changed.
    renewed: Some(include_str!("../../sql/mysql/renewed.sql")),
    holds: hold_text!(
        "mysql",
        begin: "BEGIN",
        turn: Turn::Shared(include_str!("../../sql/mysql/holds/turn.sql")),
        renewed: Some(include_str!("../../sql/mysql/holds/renewed.sql"))
    )
);

impl RowsAffected for MySqlQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// A pool for the URL. No connection is opened yet. Every connection runs in UTC (the
/// URL may not change it: expiry arithmetic converts local times) and has its statements
/// cancelled by the server after the statement time-out.
pub(crate) fn pool(config: &SqlConfig) -> Result<Pool<MySql>> {
    let options = server_options(config, "mysql", |options: MySqlConnectOptions, password| {
        options.password(password)
    })?
    .timezone(Some("+00:00".to_owned()));
    let session = format!(
        "SET SESSION max_statement_time = {:.3}",
        config.statement_timeout.as_secs_f64()
    );
    Ok(pool_options(config)
        .after_connect(move |conn: &mut sqlx::MySqlConnection, _| {
            let session = AssertSqlSafe(session.clone());
            Box::pin(async move { conn.execute(session).await.map(drop) })
        })
        .connect_lazy_with(options))
}
