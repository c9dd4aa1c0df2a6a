//! A client holding many locks renews them all with a few statements per renewal interval,
//! not one per lease, on every dialect; each lease still gets its own answer (one whose
//! row was deleted behind its holder's back is lost, the others stay held), keys full of
//! JSON and SQL metacharacters included.
//!
//! Statements are counted as sqlx reports them (its `sqlx::query` tracing events), so the
//! count is what reached the database, whatever the core asked for.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use conformance_tests::{eventually, within, SLACK};
use lock_core::backend::LockBackend;
use lock_core::{AcquireOptions, LockClient};
use support::Database;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Leases held by one client: a per-lease renewal would send this many statements a round.
const HELD: usize = 100;
const TTL: Duration = Duration::from_millis(1500);
/// Statements that may renew the leases while each is renewed three times: a few rounds,
/// each one statement (or two, while leases taken a little apart fall into step).
const MOST_STATEMENTS: usize = 12;

const KEYS: &[&str] = &[
    "\"", "\\", "\\\"", "'", "%", "_", "é", "e\u{301}", "🔒", "$1", "?",
];

/// The text of every statement sqlx ran, from its query log.
#[derive(Default)]
struct Statements(Mutex<Vec<String>>);

impl Statements {
    /// The log, installed as the global subscriber on first use.
    fn global() -> Arc<Statements> {
        static LOG: OnceLock<Arc<Statements>> = OnceLock::new();
        LOG.get_or_init(|| {
            let log = Arc::new(Statements::default());
            tracing::subscriber::set_global_default(Log(Arc::clone(&log))).unwrap();
            log
        })
        .clone()
    }

    /// How many statements so far start with `prefix` (after their comment lines).
    fn count(&self, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|sql| {
                sql.lines()
                    .map(str::trim)
                    .find(|line| !line.is_empty() && !line.starts_with("--"))
                    .is_some_and(|first| first.starts_with(prefix))
            })
            .count()
    }
}

struct Log(Arc<Statements>);

/// The full statement of a query event: `db.statement` when sqlx shortened `summary`.
#[derive(Default)]
struct StatementText {
    summary: String,
    statement: String,
}

impl Visit for StatementText {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl Subscriber for Log {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut text = StatementText::default();
        event.record(&mut text);
        let sql = if text.statement.trim().is_empty() {
            text.summary
        } else {
            text.statement
        };
        self.0 .0.lock().unwrap().push(sql);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

async fn renewals_are_batched(db: Database) {
    let log = Statements::global();
    // A table of its own, so the statements of this test are told apart by name.
    let table = format!("batch_{:x}", fastrand::u64(..));
    let batched = format!("UPDATE {table} AS held");
    let single = format!("UPDATE {table} SET");
    let config = lock_sql::SqlConfig::from_url(&db.url_with(&format!("table={table}"))).unwrap();
    let backend = lock_sql::SqlBackend::connect(config).await.unwrap();
    let client = LockClient::new(backend.clone()).with_defaults(AcquireOptions {
        ttl: TTL,
        ..AcquireOptions::default()
    });
    let mut guards = Vec::new();
    for n in 0..HELD {
        let key = format!("{}/{n}", KEYS[n % KEYS.len()]);
        guards.push(client.lock(key).await.unwrap());
    }
    // The store forgets one lease behind its holder's back: its next renewal must fail,
    // in the same batch as the others' successes.
    let forgotten = guards.pop().unwrap();
    assert!(backend
        .release(forgotten.key(), forgotten.lease().id())
        .await
        .unwrap()
        .is_held());
    let (before_batched, before_single) = (log.count(&batched), log.count(&single));
    let started = Instant::now();
    within(TTL + SLACK, "the forgotten lease is lost", forgotten.lost())
        .await
        .unwrap();
    // Three renewal rounds: every lease renewed by a request sent a TTL after the start.
    eventually(TTL * 3, "every lease is renewed three times", || async {
        Ok(guards
            .iter()
            .all(|guard| guard.lease().sent_at() >= started + TTL))
    })
    .await
    .unwrap();
    let statements = log.count(&batched) - before_batched;
    assert_eq!(
        log.count(&single),
        before_single,
        "leases were renewed one by one"
    );
    assert!(
        (3..=MOST_STATEMENTS).contains(&statements),
        "{} leases took {statements} renewal statements over three rounds",
        guards.len()
    );
    for guard in guards {
        assert!(guard.is_held(), "{:?} was lost", guard.key());
        guard.release().await.unwrap();
    }
    assert!(backend.stored_keys("").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_renews_in_batches() {
    renewals_are_batched(Database::sqlite().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renews_in_batches() {
    renewals_are_batched(Database::postgres().await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_renews_in_batches() {
    renewals_are_batched(Database::mariadb().await.unwrap()).await;
}
