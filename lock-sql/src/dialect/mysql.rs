//! MariaDB (10.5 or newer, for `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`).

use std::str::FromStr;

use lock_core::{redact_url, Error, ErrorKind, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlQueryResult};
use sqlx::{MySql, Pool};

use super::{RowsAffected, SqlText};
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
    let options = MySqlConnectOptions::from_str(config.target()).map_err(|err| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("invalid MySQL URL {}", redact_url(config.target())),
        )
        .with_source(err)
    })?;
    Ok(MySqlPoolOptions::new()
        .max_connections(config.pool_size)
        .acquire_timeout(config.connect_timeout)
        .connect_lazy_with(options))
}
