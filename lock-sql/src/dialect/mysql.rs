//! MariaDB (10.5 or newer, for `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`).

use lock_core::Result;
use sqlx::mysql::{MySqlConnectOptions, MySqlQueryResult};
use sqlx::{MySql, Pool};

use super::{lazy_pool, url_options, RowsAffected, SqlText};
use crate::config::SqlConfig;

pub(crate) const SQL: SqlText = SqlText {
    migrate: include_str!("../../sql/mysql/migrate.sql"),
    acquire: include_str!("../../sql/mysql/acquire.sql"),
    renew: include_str!("../../sql/mysql/renew.sql"),
    release: include_str!("../../sql/mysql/release.sql"),
    inspect: include_str!("../../sql/mysql/inspect.sql"),
    stored_keys: include_str!("../../sql/mysql/stored_keys.sql"),
    sweep: include_str!("../../sql/mysql/sweep.sql"),
    // sqlx sets the session time zone to UTC, so this is unambiguous; NOW(3) is fixed
    // for one statement.
    now_ms: "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
};

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
