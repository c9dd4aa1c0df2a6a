//! The SQL backend per dialect (SQLite file, private PostgreSQL and MariaDB servers): the
//! library's uncontended acquire+release cycle against the same two statements sent
//! directly with sqlx, 16 tasks on distinct keys, and 8 tasks on one key.
//!
//! Run with `cargo bench -p distlock-benches --bench sql`; servers are started by the
//! store-process fixture (PostgreSQL and MariaDB must be installed).

use std::str::FromStr;
use std::time::Duration;

use distlock_benches::{contended, report, sample};
use lock_core::{LeaseId, LockClient};
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Encode, Executor, IntoArguments, Pool, Type};

#[path = "../../lock-sql/tests/support/mod.rs"]
mod support;

const TTL: Duration = Duration::from_secs(30);

fn main() {
    distlock_benches::runtime().block_on(async {
        let sqlite = support::Database::sqlite().await.expect("sqlite");
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&sqlite.url)
            .expect("sqlite url")
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(10)
            .connect_with(options)
            .await
            .expect("sqlite pool");
        dialect(&sqlite, pool, 5_000).await;

        let postgres = support::Database::postgres().await.expect("postgres");
        let pool = Pool::<sqlx::Postgres>::connect(&postgres.url)
            .await
            .expect("postgres pool");
        dialect(&postgres, pool, 2_000).await;

        let mariadb = support::Database::mariadb().await.expect("mariadb");
        let pool = Pool::<sqlx::MySql>::connect(&mariadb.url)
            .await
            .expect("mariadb pool");
        dialect(&mariadb, pool, 2_000).await;
    });
}

async fn dialect<DB>(db: &support::Database, pool: Pool<DB>, cycles: usize)
where
    DB: Database,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB>,
    usize: ColumnIndex<DB::Row>,
{
    let backend = db.backend().await;
    let (acquire, release) = backend.statements();
    let (acquire, release) = (acquire.to_owned(), release.to_owned());
    let raw = sample(cycles, || async {
        let lease = LeaseId::random().to_string();
        let ttl_ms = i64::try_from(TTL.as_millis()).expect("small TTL");
        sqlx::query(AssertSqlSafe(acquire.clone()))
            .bind("bench/raw")
            .bind(lease.clone())
            .bind(ttl_ms)
            // No holder label, as the library's unlabelled lock below.
            .bind(None::<String>)
            .fetch_optional(&pool)
            .await
            .expect("raw acquire")
            .expect("free key");
        sqlx::query(AssertSqlSafe(release.clone()))
            .bind("bench/raw")
            .bind(lease)
            .fetch_optional(&pool)
            .await
            .expect("raw release")
            .expect("held key");
    })
    .await;

    let client = LockClient::new(backend);
    let library = sample(cycles, || async {
        let guard = client
            .try_lock("bench/library")
            .ttl(TTL)
            .await
            .expect("free key");
        guard.release().await.expect("held key");
    })
    .await;
    let distinct = contended(&client, 16, false, cycles / 16).await;
    let shared = contended(&client, 8, true, cycles / 16).await;

    let name = db.name;
    report(&format!("{name}: raw upsert + delete (uncontended)"), &raw);
    report(
        &format!("{name}: library try_lock + release (uncontended)"),
        &library,
    );
    println!(
        "{name}: library / raw median ratio: {:.2}",
        library.median.as_secs_f64() / raw.median.as_secs_f64()
    );
    report(
        &format!("{name}: 16 tasks, distinct keys, per cycle"),
        &distinct,
    );
    report(&format!("{name}: 8 tasks, one key, per handover"), &shared);
    println!(
        "{name}: handovers per second on one key: {:.0}",
        1.0 / shared.median.as_secs_f64()
    );
}
