//! Semaphores and reader-writer locks: the holds table (`<table>_holds`), one row per lease
//! of a key in its primitive, and the acquire transaction that counts a key's holders and
//! writes a grant (or a waiting writer's intent) while acquirers of the key take turns.
//!
//! Renewals, `expire_in` and releases of shared holds run the generic operations of
//! [`Ops`] with the statements of this table (`Statements::pick`).

use lock_core::backend::HolderInfo;
use lock_core::{Error, ErrorKind, FencingToken, HoldKind, LeaseId, LockKey, Result};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, SqlStr, Type};

use super::{bind_key, token_from, Ops, RowsAffected};
use crate::error::{deadlock_victim, lock_wait_timed_out};

/// The `kind` of a waiting writer's intent: it blocks new readers, holds nothing, and has
/// no token.
const INTENT: &str = "intent";

/// The statement files of one dialect's holds table (`sql/<dialect>/holds/`).
pub(crate) struct HoldText {
    /// Opens the acquire transaction.
    pub begin: &'static str,
    /// How acquirers of one key take turns.
    pub turn: Turn,
    pub clear: &'static str,
    pub rows: &'static str,
    pub token: &'static str,
    pub put: &'static str,
    pub holders: &'static str,
    pub renew: &'static str,
    pub expire_in: &'static str,
    pub renew_many: &'static str,
    /// Which holds of a batch are live, for dialects whose `renew_many` cannot return the
    /// rows it renewed.
    pub renewed: Option<&'static str>,
    pub release: &'static str,
    pub expired: &'static str,
    pub sweep: &'static str,
}

/// How the acquirers of one shared key take turns, so that two never both count the
/// holders before either writes, and tokens are drawn in grant order. (Each dialect uses
/// one variant: a build without all three leaves the others unused.)
#[derive(Clone, Copy)]
#[cfg_attr(
    not(all(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) enum Turn {
    /// The transaction's `BEGIN` takes a lock every writer needs (SQLite's
    /// `BEGIN IMMEDIATE`, the database's write lock).
    Begin,
    /// A statement taking a lock of the key's own, bound with the key and its primitive
    /// (a PostgreSQL advisory lock).
    Key(&'static str),
    /// A statement without parameters taking a lock every acquirer of any key takes
    /// (MariaDB's token counter, as the mutex's acquire does).
    Shared(&'static str),
}

/// The [`HoldText`] of the dialect whose statement files live in `sql/<dir>/holds/`.
macro_rules! hold_text {
    ($dir:literal, begin: $begin:expr, turn: $turn:expr, renewed: $renewed:expr) => {
        $crate::dialect::HoldText {
            begin: $begin,
            turn: $turn,
            clear: include_str!(concat!("../../sql/", $dir, "/holds/clear.sql")),
            rows: include_str!(concat!("../../sql/", $dir, "/holds/rows.sql")),
            token: include_str!(concat!("../../sql/", $dir, "/holds/token.sql")),
            put: include_str!(concat!("../../sql/", $dir, "/holds/put.sql")),
            holders: include_str!(concat!("../../sql/", $dir, "/holds/holders.sql")),
            renew: include_str!(concat!("../../sql/", $dir, "/holds/renew.sql")),
            expire_in: include_str!(concat!("../../sql/", $dir, "/holds/expire_in.sql")),
            renew_many: include_str!(concat!("../../sql/", $dir, "/holds/renew_many.sql")),
            renewed: $renewed,
            release: include_str!(concat!("../../sql/", $dir, "/holds/release.sql")),
            expired: include_str!(concat!("../../sql/", $dir, "/holds/expired.sql")),
            sweep: include_str!(concat!("../../sql/", $dir, "/holds/sweep.sql")),
        }
    };
}
pub(crate) use hold_text;

/// The holds table's statements for one table, prepared once per backend.
#[derive(Clone, Debug)]
pub(super) struct HoldStatements {
    begin: SqlStr,
    /// The turn's statement, if not `begin`, and whether it is bound with the key.
    turn: Option<(SqlStr, bool)>,
    clear: SqlStr,
    rows: SqlStr,
    token: SqlStr,
    put: SqlStr,
    holders: SqlStr,
    pub(super) renew: SqlStr,
    pub(super) expire_in: SqlStr,
    pub(super) renew_many: SqlStr,
    pub(super) renewed: Option<SqlStr>,
    pub(super) release: SqlStr,
    pub(super) expired: SqlStr,
    pub(super) sweep: SqlStr,
}

impl HoldStatements {
    /// `fill` puts the table's name and the clock expressions into a statement's text.
    pub(super) fn new(text: &HoldText, fill: &impl Fn(&str) -> SqlStr) -> Self {
        HoldStatements {
            begin: fill(text.begin),
            turn: match text.turn {
                Turn::Begin => None,
                Turn::Key(sql) => Some((fill(sql), true)),
                Turn::Shared(sql) => Some((fill(sql), false)),
            },
            clear: fill(text.clear),
            rows: fill(text.rows),
            token: fill(text.token),
            put: fill(text.put),
            holders: fill(text.holders),
            renew: fill(text.renew),
            expire_in: fill(text.expire_in),
            renew_many: fill(text.renew_many),
            renewed: text.renewed.map(fill),
            release: fill(text.release),
            expired: fill(text.expired),
            sweep: fill(text.sweep),
        }
    }
}

/// The name a key's releases are announced under (PostgreSQL's NOTIFY payload) and its
/// waiters watch: the key itself for a mutex; for a semaphore or reader-writer lock the
/// primitive and the key joined by a control character, which no key contains, so the
/// three namespaces never wake each other's waiters.
#[cfg(feature = "postgres")]
pub(crate) fn watch_name(key: &LockKey) -> String {
    match key.primitive() {
        lock_core::Primitive::Mutex => key.as_str().to_owned(),
        shared => format!("{}\u{1f}{}", shared.name(), key.as_str()),
    }
}

/// Whether a release announced under `name` ([`watch_name`]) may let several waiters in
/// at once: a semaphore's or reader-writer lock's.
#[cfg(feature = "postgres")]
pub(crate) fn releases_many(name: &str) -> bool {
    name.contains('\u{1f}')
}

/// A key's entry as the acquire transaction reads it (rows.sql).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    lease: String,
    /// `permit`, `read`, `write` or [`INTENT`].
    kind: String,
    /// The semaphore's limit the holder asked with; 0 for a reader-writer lock.
    permits: i64,
    token: i64,
}

/// What an acquire does, decided from the key's live entries.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Writes the grant: with the lease's own token when it holds the key already (a
    /// retry), else with a new one.
    Grant(Option<i64>),
    /// Refused; a waiting writer leaves (or refreshes) its intent.
    Refuse { intent: bool },
    /// A holder asked the semaphore with this other limit.
    LimitDiffers(i64),
}

/// The grant rules of `LockBackend`'s "Shared holds" for `kind` asked by `lease` (which
/// `waits` or not), over the key's live entries.
fn decide(entries: &[Entry], lease: &str, kind: HoldKind, waits: bool) -> Decision {
    if let Some(own) = entries
        .iter()
        .find(|entry| entry.lease == lease && entry.kind == kind.name())
    {
        return Decision::Grant(Some(own.token));
    }
    let mut others = entries.iter().filter(|entry| entry.lease != lease);
    match kind {
        HoldKind::Permit { limit } => {
            let permits: Vec<&Entry> = others.filter(|entry| entry.kind == kind.name()).collect();
            if let Some(other) = permits
                .iter()
                .find(|entry| entry.permits != i64::from(limit))
            {
                return Decision::LimitDiffers(other.permits);
            }
            if permits.len() < usize::try_from(limit).unwrap_or(usize::MAX) {
                Decision::Grant(None)
            } else {
                Decision::Refuse { intent: false }
            }
        }
        HoldKind::Read => {
            // A waiting writer's intent keeps new readers out (writer preference).
            if others.any(|entry| entry.kind == HoldKind::Write.name() || entry.kind == INTENT) {
                Decision::Refuse { intent: false }
            } else {
                Decision::Grant(None)
            }
        }
        HoldKind::Write | HoldKind::Mutex => {
            if others.any(|entry| entry.kind != INTENT) {
                Decision::Refuse { intent: waits }
            } else {
                Decision::Grant(None)
            }
        }
    }
}

/// How one acquire transaction ended.
enum Attempt {
    Granted(i64),
    Refused,
    LimitDiffers(i64),
}

/// One shared acquire as the transaction needs it (owned: it outlives the caller's
/// borrows inside the connection's future).
struct SharedRequest {
    key: String,
    primitive: &'static str,
    lease: String,
    kind: HoldKind,
    permits: i64,
    ttl_ms: i64,
    holder: Option<String>,
    waits: bool,
}

ops_impl! {
    /// Grants the shared `key` (a permit, a read or a write) to `lease_id` for `ttl_ms`
    /// by the grant rules, labelled `holder`; `None` when refused. A refused write that
    /// `waits` leaves its intent. One transaction in which acquirers of the key take
    /// turns: its expired entries are deleted, the live ones read, and the grant or the
    /// intent written.
    pub(crate) async fn acquire_shared(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl_ms: i64,
        holder: Option<String>,
        waits: bool,
    ) -> Result<Option<FencingToken>> {
        let request = SharedRequest {
            key: key.as_str().to_owned(),
            primitive: key.primitive().name(),
            lease: lease_id.to_string(),
            kind: key.kind(),
            permits: match key.kind() {
                HoldKind::Permit { limit } => i64::from(limit),
                _ => 0,
            },
            ttl_ms,
            holder,
            waits,
        };
        let sql = self.sql.holds.clone();
        let dialect = self.dialect;
        let attempt = self
            .on_connection("acquire", move |conn| {
                Box::pin(async move {
                    let mut tx = sqlx::Connection::begin_with(conn, sql.begin.clone()).await?;
                    match Self::attempt(&mut tx, &sql, &request).await {
                        Ok((attempt, wrote)) => {
                            if wrote {
                                tx.commit().await?;
                            } else {
                                tx.rollback().await?;
                            }
                            Ok(attempt)
                        }
                        // Another transaction holds the key's turn or a row of it and did
                        // not finish within the short lock wait, or a renewal batch locking
                        // rows of this key in another order made this transaction a
                        // deadlock's victim: contended, nothing written.
                        Err(err)
                            if lock_wait_timed_out(dialect, &err)
                                || deadlock_victim(dialect, &err) =>
                        {
                            tracing::debug!(%err, "shared acquire gave up waiting for a lock");
                            tx.rollback().await?;
                            Ok(Attempt::Refused)
                        }
                        Err(err) => Err(err),
                    }
                })
            })
            .await?;
        match attempt {
            Attempt::Granted(token) => Ok(Some(token_from(token)?)),
            Attempt::Refused => Ok(None),
            Attempt::LimitDiffers(theirs) => Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "semaphore {:?} is held with a limit of {theirs} permits; asked with a \
                     limit of {}: every holder of a semaphore must ask with the same limit",
                    key.as_str(),
                    match key.kind() {
                        HoldKind::Permit { limit } => limit,
                        _ => 0,
                    }
                ),
            )),
        }
    }

    /// The acquire transaction's statements, inside the open transaction `conn`: what
    /// it decided, and whether it wrote anything (to commit) or not (to roll back).
    async fn attempt(
        conn: &mut DB::Connection,
        sql: &HoldStatements,
        request: &SharedRequest,
    ) -> sqlx::Result<(Attempt, bool)> {
        let by_key = |statement: &SqlStr| {
            sqlx::query(statement.clone())
                .bind(request.key.clone())
                .bind(request.primitive.to_owned())
        };
        match &sql.turn {
            Some((turn, true)) => drop(by_key(turn).execute(&mut *conn).await?),
            Some((turn, false)) => drop(sqlx::query(turn.clone()).execute(&mut *conn).await?),
            None => {}
        }
        let cleared = by_key(&sql.clear).execute(&mut *conn).await?.rows() > 0;
        let entries = by_key(&sql.rows)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|row| {
                Ok(Entry {
                    lease: row.try_get(0)?,
                    kind: row.try_get(1)?,
                    permits: row.try_get(2)?,
                    token: row.try_get(3)?,
                })
            })
            .collect::<sqlx::Result<Vec<_>>>()?;
        let put = |kind: &str, permits: i64, token: i64| {
            sqlx::query(sql.put.clone())
                .bind(request.key.clone())
                .bind(request.primitive.to_owned())
                .bind(request.lease.clone())
                .bind(kind.to_owned())
                .bind(permits)
                .bind(token)
                .bind(request.ttl_ms)
                .bind(request.holder.clone())
        };
        match decide(&entries, &request.lease, request.kind, request.waits) {
            Decision::Grant(token) => {
                let token = match token {
                    Some(own) => own,
                    None => {
                        let row = sqlx::query(sql.token.clone()).fetch_one(&mut *conn).await?;
                        row.try_get(0)?
                    }
                };
                put(request.kind.name(), request.permits, token)
                    .execute(&mut *conn)
                    .await?;
                Ok((Attempt::Granted(token), true))
            }
            Decision::Refuse { intent: true } => {
                put(INTENT, 0, 0).execute(&mut *conn).await?;
                Ok((Attempt::Refused, true))
            }
            Decision::Refuse { intent: false } => Ok((Attempt::Refused, cleared)),
            Decision::LimitDiffers(theirs) => Ok((Attempt::LimitDiffers(theirs), false)),
        }
    }

    /// Every live holder of the shared `key`, oldest grant first.
    pub(crate) async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        let query = bind_key(sqlx::query(self.sql.holds.holders.clone()), key);
        let rows = self
            .on_connection("listing holders", move |conn| {
                Box::pin(query.fetch_all(conn))
            })
            .await?;
        rows.iter()
            .map(|row| {
                let mut holder = self.holder_at(row, 0)?;
                let (kind, permits): (String, i64) =
                    (|| Ok::<_, sqlx::Error>((row.try_get(4)?, row.try_get(5)?)))()
                        .map_err(self.fail("reading the holder"))?;
                holder.kind = hold_kind(&kind, permits)?;
                Ok(holder)
            })
            .collect()
    }
}

/// A holds-table row's kind and limit as the core's [`HoldKind`].
fn hold_kind(kind: &str, permits: i64) -> Result<HoldKind> {
    match kind {
        "permit" => u32::try_from(permits)
            .ok()
            .filter(|limit| *limit > 0)
            .map(|limit| HoldKind::Permit { limit })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    format!("the holds table has a permit with a limit of {permits}"),
                )
            }),
        "read" => Ok(HoldKind::Read),
        "write" => Ok(HoldKind::Write),
        other => Err(Error::new(
            ErrorKind::Internal,
            format!("the holds table has a holder of unknown kind {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(lease: &str, kind: &str, permits: i64, token: i64) -> Entry {
        Entry {
            lease: lease.to_owned(),
            kind: kind.to_owned(),
            permits,
            token,
        }
    }

    #[test]
    fn permits_are_granted_up_to_the_limit_of_everyone() {
        let two = HoldKind::Permit { limit: 2 };
        let one = [entry("a", "permit", 2, 5)];
        assert_eq!(decide(&one, "b", two, true), Decision::Grant(None));
        let full = [entry("a", "permit", 2, 5), entry("b", "permit", 2, 6)];
        assert_eq!(
            decide(&full, "c", two, true),
            Decision::Refuse { intent: false }
        );
        assert_eq!(decide(&full, "b", two, false), Decision::Grant(Some(6)));
        assert_eq!(
            decide(&one, "b", HoldKind::Permit { limit: 3 }, false),
            Decision::LimitDiffers(2)
        );
    }

    #[test]
    fn readers_share_and_writers_wait_for_everyone() {
        let readers = [entry("a", "read", 0, 5), entry("b", "read", 0, 6)];
        assert_eq!(
            decide(&readers, "c", HoldKind::Read, true),
            Decision::Grant(None)
        );
        assert_eq!(
            decide(&readers, "c", HoldKind::Write, true),
            Decision::Refuse { intent: true }
        );
        assert_eq!(
            decide(&readers, "c", HoldKind::Write, false),
            Decision::Refuse { intent: false }
        );
        let waiting = [entry("a", "read", 0, 5), entry("w", INTENT, 0, 0)];
        assert_eq!(
            decide(&waiting, "c", HoldKind::Read, true),
            Decision::Refuse { intent: false }
        );
        // The writer's own intent is no obstacle once the readers left.
        assert_eq!(
            decide(&[entry("w", INTENT, 0, 0)], "w", HoldKind::Write, true),
            Decision::Grant(None)
        );
        // Another writer's intent does not keep a writer out.
        assert_eq!(
            decide(&[entry("v", INTENT, 0, 0)], "w", HoldKind::Write, true),
            Decision::Grant(None)
        );
        assert_eq!(
            decide(&[entry("w", "write", 0, 9)], "r", HoldKind::Read, true),
            Decision::Refuse { intent: false }
        );
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn watch_names_never_meet_across_primitives() {
        let key = LockKey::new("k").expect("a valid key");
        let semaphore = key
            .held_as(HoldKind::Permit { limit: 2 })
            .expect("a valid key");
        let rwlock = key.held_as(HoldKind::Read).expect("a valid key");
        let names = [
            watch_name(&key),
            watch_name(&semaphore),
            watch_name(&rwlock),
        ];
        assert_eq!(names[0], "k");
        assert_ne!(names[1], names[2]);
        assert_eq!(
            watch_name(&rwlock),
            watch_name(&key.held_as(HoldKind::Write).expect("a valid key"))
        );
    }
}
