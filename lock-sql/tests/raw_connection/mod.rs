//! A plain PostgreSQL or MariaDB connection of the test's own, for tests that play another
//! transaction or watch the server's lock tables.

#![allow(dead_code, clippy::unwrap_used)]

use conformance_tests::store_process::MARIADB_DATABASE;

use crate::support::Database;

/// A plain connection to a server database, for tests that play another transaction.
pub enum RawConnection {
    Postgres(sqlx::PgConnection),
    MySql(sqlx::MySqlConnection),
}

impl RawConnection {
    pub async fn open(db: &Database) -> Self {
        use sqlx::Connection;
        match db.name {
            "postgres" => Self::Postgres(sqlx::PgConnection::connect(&db.url).await.unwrap()),
            _ => Self::MySql(sqlx::MySqlConnection::connect(&db.url).await.unwrap()),
        }
    }

    /// A connection that may read the server's lock tables (MariaDB's need the PROCESS
    /// privilege, which the test user lacks).
    pub async fn observer(db: &Database) -> Self {
        use sqlx::Connection;
        match db.name {
            "postgres" => Self::open(db).await,
            _ => {
                let port = db.server.as_ref().unwrap().port();
                let url = format!("mysql://root@127.0.0.1:{port}/{MARIADB_DATABASE}");
                Self::MySql(sqlx::MySqlConnection::connect(&url).await.unwrap())
            }
        }
    }

    pub async fn run(&mut self, sql: &str) {
        use sqlx::Executor;
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres(conn) => drop(conn.execute(sql).await.unwrap()),
            Self::MySql(conn) => drop(conn.execute(sql).await.unwrap()),
        }
    }

    /// The first column of the first row `sql` returns, as an integer.
    pub async fn fetch_i64(&mut self, sql: &str) -> Option<i64> {
        use sqlx::Row;
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres(conn) => sqlx::query(sql)
                .fetch_optional(conn)
                .await
                .unwrap()
                .map(|row| row.get(0)),
            Self::MySql(conn) => sqlx::query(sql)
                .fetch_optional(conn)
                .await
                .unwrap()
                .map(|row| row.get(0)),
        }
    }

    /// Waits (up to 5 s) until at least `count` statements wait for a lock.
    pub async fn wait_for_lock_waits(db: &Database, count: usize) {
        let mut observer = Self::observer(db).await;
        let sql = match db.name {
            "postgres" => "SELECT count(*) FROM pg_locks WHERE NOT granted",
            _ => "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let waiting = observer.fetch_i64(sql).await.unwrap_or(0);
            if waiting >= count as i64 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "only {waiting} of {count} statements wait for a lock"
            );
            // InnoDB refreshes its lock tables only when they were not read for 100 ms.
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        }
    }
}
