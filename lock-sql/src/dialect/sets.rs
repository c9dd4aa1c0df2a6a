//! Lock sets: several mutex keys granted in one transaction, all or none.
//!
//! Each key is taken by the dialect's own acquire statement (acquire.sql), exactly as a
//! single acquire takes it, one after the other inside one transaction; the first key
//! held by another live lease rolls the whole transaction back. Keys go in key order, so
//! every transaction that takes several keys takes their locks (PostgreSQL's turn and
//! row locks, InnoDB's row locks) in one canonical order and two sets cannot wait on
//! each other in a cycle. (On MariaDB the token counter, locked by the first grant until
//! the commit, serialises sets anyway.) A statement that locks several rows in an order
//! of its own, a batched renewal, can still close a cycle with a set in a rare race (a
//! lease expiring while both run); the database then ends one of them, which fails as
//! `Unavailable` and is retried, as any transient error is.

use lock_core::{Error, ErrorKind, FencingToken, LeaseId, LockKey, Primitive, Result};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::{granted, Ops, RowsAffected};
use crate::config::Dialect;

/// One key of a set: the key, the lease to grant it to, the TTL in milliseconds and the
/// holder label.
pub(crate) type SetMember = (LockKey, LeaseId, i64, Option<String>);

ops_impl! {
    /// Grants every key of `members` to its lease, each as [`acquire`](Self::acquire)
    /// would alone (a retry of the same leases answers their tokens again), in one
    /// transaction: the tokens in the order of `members`, or `None`, having written
    /// nothing, when another live lease holds any of the keys (or a key's lock is
    /// contended past the statement's short lock wait).
    pub(crate) async fn acquire_all(
        &self,
        members: &[SetMember],
    ) -> Result<Option<Vec<FencingToken>>> {
        if let Some((key, ..)) = members
            .iter()
            .find(|(key, ..)| key.primitive() != Primitive::Mutex)
        {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "a lock set takes mutex keys only, not {:?}",
                    key.primitive().name()
                ),
            ));
        }
        // Key order, whatever order the caller used (the core's is key order already):
        // see the module's docs.
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by(|&a, &b| members[a].0.as_str().cmp(members[b].0.as_str()));
        let statements: Vec<_> = order
            .into_iter()
            .map(|at| {
                let (key, lease_id, ttl_ms, holder) = &members[at];
                (
                    at,
                    *lease_id,
                    self.acquire_query(key, *lease_id, *ttl_ms, holder.clone()),
                )
            })
            .collect();
        let count = members.len();
        let dialect = self.dialect;
        // SQLite: the write lock from the start, so the transaction never has to upgrade
        // a read lock (which fails at once, without the busy time-out, if another writer
        // came first).
        let begin = match dialect {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            _ => "BEGIN",
        };
        self.on_connection("acquire a lock set", move |conn| {
            Box::pin(async move {
                let mut tx = sqlx::Connection::begin_with(conn, begin).await?;
                let mut tokens = vec![None; count];
                for (at, lease_id, query) in statements {
                    let row = Self::acquire_on(&mut tx, query, dialect).await?;
                    let refused = match granted::<DB>(dialect, row, lease_id) {
                        Ok(Some(token)) => {
                            tokens[at] = Some(token);
                            continue;
                        }
                        // Held by another lease (or contended); or (MariaDB) a grant born
                        // expired, which the rollback undoes, so the caller may try again.
                        other => other.map(|_| None),
                    };
                    tx.rollback().await?;
                    return Ok(refused);
                }
                tx.commit().await?;
                Ok(Ok(Some(tokens.into_iter().flatten().collect())))
            })
        })
        .await?
    }
}
