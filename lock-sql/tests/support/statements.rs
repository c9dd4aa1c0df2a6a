//! `UPDATE` statements per lock table, counted from sqlx's query log: an embedded SQLite
//! database has no server to count them, so the SQLite factory counts what sqlx sent it
//! (for the batching scenario).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The watched tables' counts; `None` until the log is installed, or if it could not be.
static COUNTS: LazyLock<Result<Mutex<HashMap<String, u64>>, String>> = LazyLock::new(|| {
    tracing::subscriber::set_global_default(QueryLog)
        .map_err(|err| format!("cannot install the query log: {err}"))?;
    Ok(Mutex::default())
});

fn counts() -> Result<std::sync::MutexGuard<'static, HashMap<String, u64>>, String> {
    let counts = COUNTS.as_ref().map_err(Clone::clone)?;
    Ok(counts
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// Starts counting the `UPDATE` statements on `table` (installing the query log as the
/// global subscriber on first use).
pub fn watch(table: &str) -> Result<(), String> {
    counts()?.insert(table.to_owned(), 0);
    Ok(())
}

/// How many `UPDATE` statements on `table` sqlx has run since [`watch`].
pub fn updates(table: &str) -> Result<u64, String> {
    counts()?
        .get(table)
        .copied()
        .ok_or_else(|| format!("{table} is not watched"))
}

/// Counts `sql` if it updates a watched table.
fn ran(sql: &str) {
    let Some(first) = sql
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with("--"))
    else {
        return;
    };
    let mut words = first.split_whitespace();
    if !words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("UPDATE"))
    {
        return;
    }
    if let (Some(table), Ok(mut counts)) = (words.next(), counts()) {
        if let Some(count) = counts.get_mut(table) {
            *count += 1;
        }
    }
}

/// Sees only sqlx's query events.
struct QueryLog;

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

impl Subscriber for QueryLog {
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
        if text.statement.trim().is_empty() {
            ran(&text.summary);
        } else {
            ran(&text.statement);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
