//! MariaDB (10.5 or newer, for `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`).

use lock_core::Result;
use sqlx::mysql::{MySqlConnectOptions, MySqlQueryResult};
use sqlx::{MySql, Pool};

use super::{lazy_pool, sql_text, url_options, RowsAffected, SqlText};
use crate::config::SqlConfig;

pub(crate) const SQL: SqlText = sql_text!(
    "mysql",
    // sqlx sets the session time zone to UTC, so this is unambiguous; NOW(3) is fixed
    // for one statement.
    now_ms: "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
);

impl RowsAffected for MySqlQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// A pool for the URL. No connection is opened yet.
pub(crate) fn pool(config: &SqlConfig) -> Result<Pool<MySql>> {
    let options: MySqlConnectOptions = url_options(config, "MySQL")?;
    Ok(lazy_pool(config, options))
}
