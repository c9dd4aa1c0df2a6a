//! The lock backend over one SQL database.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::backend::async_trait;
use lock_core::backend::{
    finish_if_dropped, lock_unpoisoned, AcquireRequest, Grant, HolderInfo, KeyWatch, LeaseRenewal,
    LockBackend, Ownership, Record,
};
use lock_core::{Capabilities, Error, ErrorKind, LeaseId, Liveness, LockKey, Primitive, Result};

use crate::config::{Dialect, SqlConfig};
#[cfg(feature = "mysql")]
use crate::dialect::mysql;
#[cfg(feature = "postgres")]
use crate::dialect::postgres;
#[cfg(feature = "sqlite")]
use crate::dialect::sqlite;
use crate::dialect::Ops;

/// After this many releases and record writes through one backend, expired rows of
/// crashed holders that nobody took over, and records past their retention, are deleted
/// (a few extra statements per this many operations). An idempotent run follows its
/// record write with a release, so a sweep comes at least every 512 records, and it
/// deletes up to a thousand: expired records cannot pile up faster than they are swept.
const SWEEP_EVERY: u64 = 1024;

#[doc = include_str!("../docs.md")]
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    config: SqlConfig,
    capabilities: Capabilities,
    /// Releases and record writes so far, for the periodic sweep.
    writes: AtomicU64,
    in_flight: Arc<InFlight>,
    #[cfg(feature = "postgres")]
    listener: Option<postgres::Listener>,
}

/// Acquire statements still running, by lease id: a release of that lease waits for every
/// one of them to finish, so an acquisition cancelled mid-statement (whose statement the
/// server may still apply) cannot be overtaken by the core's clean-up release, and neither
/// can an earlier, unanswered attempt of a lease whose retry succeeded. The core's second
/// clean-up release, a request time-out later, does not cover this: a statement may wait
/// for row locks until the statement time-out (docs.md, "Abandoned acquisitions").
#[derive(Default)]
struct InFlight(std::sync::Mutex<HashMap<LeaseId, Vec<Gate>>>);

/// Held by a running acquire statement; locking it waits for the statement's end.
type Gate = Arc<tokio::sync::Mutex<()>>;

/// One running acquire statement; dropping it (when the statement ended) opens its gate.
struct Running {
    in_flight: Arc<InFlight>,
    lease_id: LeaseId,
    gate: Gate,
    _open: tokio::sync::OwnedMutexGuard<()>,
}

impl InFlight {
    /// Records a statement of `lease_id` that starts now.
    async fn start(self: &Arc<Self>, lease_id: LeaseId) -> Running {
        let gate = Gate::default();
        let open = Arc::clone(&gate).lock_owned().await;
        lock_unpoisoned(&self.0)
            .entry(lease_id)
            .or_default()
            .push(Arc::clone(&gate));
        Running {
            in_flight: Arc::clone(self),
            lease_id,
            gate,
            _open: open,
        }
    }

    /// Waits until every statement of `lease_id` running now has ended.
    async fn wait_for(&self, lease_id: LeaseId) {
        let running: Vec<Gate> = lock_unpoisoned(&self.0)
            .get(&lease_id)
            .cloned()
            .unwrap_or_default();
        for gate in running {
            drop(gate.lock().await);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut gates = lock_unpoisoned(&self.in_flight.0);
        if let Some(running) = gates.get_mut(&self.lease_id) {
            running.retain(|gate| !Arc::ptr_eq(gate, &self.gate));
            if running.is_empty() {
                gates.remove(&self.lease_id);
            }
        }
    }
}

enum Store {
    #[cfg(feature = "sqlite")]
    Sqlite(Ops<sqlx::Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(Ops<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Ops<sqlx::MySql>),
}

/// Runs the same generic operation on whichever dialect the store is.
macro_rules! on_store {
    ($store:expr, $ops:ident => $body:expr) => {
        match $store {
            #[cfg(feature = "sqlite")]
            Store::Sqlite($ops) => $body,
            #[cfg(feature = "postgres")]
            Store::Postgres($ops) => $body,
            #[cfg(feature = "mysql")]
            Store::MySql($ops) => $body,
        }
    };
}

// After `on_store!`, which it uses.
mod sets;

impl SqlBackend {
    /// Connects with `config` and creates the lock table if it is missing
    /// ([`migrate`](Self::migrate)).
    pub async fn connect(config: SqlConfig) -> Result<Self> {
        let backend = Self::new(config)?;
        // PostgreSQL: the shared listener opens its own connection meanwhile, so the first
        // waiter finds it listening.
        #[cfg(feature = "postgres")]
        backend.notifier();
        backend.migrate().await?;
        Ok(backend)
    }

    /// A backend for `config` that has not touched the database yet: connections are
    /// opened on first use, and the table must exist (see [`migrate`](Self::migrate)).
    /// Outside a Tokio runtime it is [`ErrorKind::InvalidInput`].
    pub fn new(config: SqlConfig) -> Result<Self> {
        lock_core::backend::require_runtime(config.dialect().name())?;
        crate::config::validate_table(&config.table)?;
        let dialect = config.dialect();
        // PostgreSQL's LISTEN connection, with the same connect options as the pool's.
        #[cfg(feature = "postgres")]
        let listener = (dialect == Dialect::Postgres)
            .then(|| {
                postgres::connect_options(&config)
                    .map(|options| postgres::Listener::new(&config, options))
            })
            .transpose()?;
        let store = match (dialect, config.file()) {
            #[cfg(feature = "sqlite")]
            (Dialect::Sqlite, Some(file)) => {
                Store::Sqlite(Ops::new(sqlite::pool(&config, file), &sqlite::SQL, &config))
            }
            #[cfg(feature = "postgres")]
            (Dialect::Postgres, _) => Store::Postgres(Ops::new(
                postgres::pool(&config, postgres::connect_options(&config)?),
                &postgres::SQL,
                &config,
            )),
            #[cfg(feature = "mysql")]
            (Dialect::MySql, _) => {
                Store::MySql(Ops::new(mysql::pool(&config)?, &mysql::SQL, &config))
            }
            #[allow(unreachable_patterns)]
            (other, _) => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("lock-sql was built without the `{}` feature", other.name()),
                ))
            }
        };
        Ok(SqlBackend {
            inner: Arc::new(Inner {
                store,
                capabilities: Capabilities {
                    fair_ordering: false,
                    native_notification: dialect == Dialect::Postgres,
                    // PostgreSQL: checked by `migrate` (see docs.md).
                    durable_fencing: true,
                    reentrancy: true,
                    // One statement renews every due lease of a client (`renew_many`).
                    liveness: Liveness::Batched,
                    min_ttl: Duration::from_millis(10),
                    max_ttl: Duration::from_secs(30 * 24 * 60 * 60),
                    ttl_granularity: Duration::from_millis(1),
                    // A table beside the lock table, written fenced by the holder's row.
                    records: true,
                    // The holds table beside the lock table (docs.md, "Semaphores and
                    // reader-writer locks").
                    shared_holds: true,
                    // One transaction takes a whole set (backend/sets.rs).
                    atomic_sets: true,
                    ..Capabilities::default()
                },
                config,
                writes: AtomicU64::new(0),
                in_flight: Arc::default(),
                #[cfg(feature = "postgres")]
                listener,
            }),
        })
    }

    /// Creates the lock table and its fencing counter if they are missing. Idempotent and
    /// safe when many processes start at once; [`connect`](Self::connect) runs it.
    ///
    /// On PostgreSQL it also checks what durable fencing tokens rest on, and fails with
    /// [`ErrorKind::Misconfigured`] when the connections do not commit synchronously or
    /// the token sequence caches, cycles or counts down.
    pub async fn migrate(&self) -> Result<()> {
        on_store!(&self.inner.store, ops => ops.migrate().await)?;
        #[cfg(feature = "postgres")]
        if let Some((ops, _)) = self.inner.postgres() {
            postgres::check_durability(ops, &self.inner.config.table).await?;
        }
        Ok(())
    }

    /// The dialect this backend speaks.
    pub fn dialect(&self) -> Dialect {
        self.inner.config.dialect()
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        &self.inner.config.table
    }

    /// Deletes the rows of expired leases nobody took over (crashed holders), of expired
    /// shared holds and writer intents, and the idempotency records past their retention,
    /// up to a thousand of each per call;
    /// returns how many rows. Runs by itself every 1024 releases and record writes;
    /// expired rows never block anyone and expired records are never read.
    pub async fn sweep_expired(&self) -> Result<u64> {
        on_store!(&self.inner.store, ops => ops.sweep().await)
    }

    /// The acquire and release statements exactly as this backend sends them (with the
    /// table name and clock expressions filled in): the baseline for benchmarks. Acquire
    /// binds the key, the lease id, the TTL in milliseconds and the holder label (or
    /// `NULL`); release the key and the lease id.
    pub fn statements(&self) -> (&str, &str) {
        on_store!(&self.inner.store, ops => (ops.sql.acquire_sql(), ops.sql.release_sql()))
    }

    /// The shared LISTEN task of a PostgreSQL backend, started on first use (inside a
    /// tokio runtime); `None` for other dialects.
    #[cfg(feature = "postgres")]
    fn notifier(&self) -> Option<&postgres::Notifier> {
        self.inner
            .listener
            .as_ref()
            .map(postgres::Listener::notifier)
    }

    /// A store TTL (already rounded up to whole milliseconds by the core) in milliseconds.
    fn ttl_ms(&self, ttl: Duration) -> Result<i64> {
        i64::try_from(ttl.as_millis())
            .map_err(|_| Error::new(ErrorKind::InvalidInput, format!("TTL {ttl:?} is too large")))
    }
}

impl Inner {
    /// The operations and the listener of a PostgreSQL backend.
    #[cfg(feature = "postgres")]
    // With only the `postgres` feature the store has no other variant.
    #[allow(irrefutable_let_patterns)]
    fn postgres(&self) -> Option<(&Ops<sqlx::Postgres>, &postgres::Listener)> {
        let Store::Postgres(ops) = &self.store else {
            return None;
        };
        Some((ops, self.listener.as_ref()?))
    }

    async fn release(self: Arc<Self>, key: LockKey, lease_id: LeaseId) -> Result<Ownership> {
        self.in_flight.wait_for(lease_id).await;
        let released = on_store!(&self.store, ops => ops.release(&key, lease_id).await)?;
        #[cfg(feature = "postgres")]
        if released.is_some() && self.postgres().is_some() {
            let inner = Arc::clone(&self);
            let key = key.clone();
            tokio::spawn(async move {
                if let Some((ops, listener)) = inner.postgres() {
                    listener.released(ops, &key).await;
                }
            });
        }
        self.count_write().await;
        Ok(released.unwrap_or(Ownership::NotHeld))
    }

    /// Counts a release or record write, and sweeps expired rows every [`SWEEP_EVERY`].
    async fn count_write(&self) {
        if self.writes.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            if let Err(err) = on_store!(&self.store, ops => ops.sweep().await) {
                tracing::debug!(error = %err, "sweeping expired leases and records failed");
            }
        }
    }

    async fn write_record(
        self: Arc<Self>,
        key: LockKey,
        lease_id: LeaseId,
        record: Record,
        retention_ms: i64,
    ) -> Result<Ownership> {
        let written = on_store!(
            &self.store,
            ops => ops.write_record(&key, lease_id, &record, retention_ms).await
        )?;
        self.count_write().await;
        Ok(written)
    }
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn name(&self) -> &'static str {
        self.dialect().name()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let ttl_ms = self.ttl_ms(request.store_ttl())?;
        let lease_id = request.lease_id();
        let running = self.inner.in_flight.start(lease_id).await;
        // Runs to completion even if the caller gives up, then opens the gate.
        let inner = Arc::clone(&self.inner);
        let key = request.key().clone();
        let holder = request.holder_label().map(str::to_owned);
        let waits = request.waits();
        finish_if_dropped(async move {
            let result = match key.primitive() {
                Primitive::Mutex => on_store!(
                    &inner.store,
                    ops => ops.acquire(&key, lease_id, ttl_ms, holder).await
                ),
                _ => on_store!(
                    &inner.store,
                    ops => ops.acquire_shared(&key, lease_id, ttl_ms, holder, waits).await
                ),
            };
            drop(running);
            result.map(|granted| granted.map(Grant::new))
        })
        .await
    }

    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<Option<Vec<Grant>>> {
        self.acquire_all(requests).await
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<Ownership> {
        let ttl_ms = self.ttl_ms(ttl)?;
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        // Finished even if the caller gives up, so the statement is never cut off half-way
        // (which would leave its connection to an unbounded health check).
        finish_if_dropped(async move {
            on_store!(&inner.store, ops => ops.renew(&key, lease_id, ttl_ms).await)
        })
        .await
    }

    async fn expire_in(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        ttl: Duration,
    ) -> Result<Ownership> {
        let ttl_ms = self.ttl_ms(ttl)?;
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        // Finished even if the caller gives up, as `renew` is.
        finish_if_dropped(async move {
            on_store!(&inner.store, ops => ops.expire_in(&key, lease_id, ttl_ms).await)
        })
        .await
    }

    async fn renew_many(&self, leases: &[LeaseRenewal]) -> Vec<Result<Ownership>> {
        let batch: Result<Vec<_>> = leases
            .iter()
            .map(|lease| Ok((lease.key.clone(), lease.lease_id, self.ttl_ms(lease.ttl)?)))
            .collect();
        let batch = match batch {
            Ok(batch) => batch,
            Err(err) => return vec![Err(err); leases.len()],
        };
        let inner = Arc::clone(&self.inner);
        // Finished even if the caller gives up, as `renew` is.
        let renewed = finish_if_dropped(async move {
            on_store!(&inner.store, ops => ops.renew_many(&batch).await)
        })
        .await;
        match renewed {
            Ok(renewed) => renewed.into_iter().map(Ok).collect(),
            Err(err) => vec![Err(err); leases.len()],
        }
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<Ownership> {
        finish_if_dropped(Arc::clone(&self.inner).release(key.clone(), lease_id)).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>> {
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        finish_if_dropped(async move { on_store!(&inner.store, ops => ops.inspect(&key).await) })
            .await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>> {
        if key.primitive() == Primitive::Mutex {
            return Ok(self.inspect(key).await?.into_iter().collect());
        }
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        finish_if_dropped(async move { on_store!(&inner.store, ops => ops.holders(&key).await) })
            .await
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<(LockKey, HolderInfo)>> {
        on_store!(&self.inner.store, ops => ops.list_held(prefix, limit).await)
    }

    /// Keys that have a row: held, or expired and not yet swept; of a semaphore or
    /// reader-writer lock also a waiting writer's intent.
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut keys = on_store!(&self.inner.store, ops => ops.stored_keys(prefix).await)?;
        // In Rust's order, whatever the database's collation.
        keys.sort();
        Ok(keys)
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        #[cfg(feature = "postgres")]
        if let Some(notifier) = self.notifier() {
            return Ok(Some(notifier.subscribe(&crate::dialect::watch_name(key))));
        }
        let _ = key;
        Ok(None)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Record>> {
        let inner = Arc::clone(&self.inner);
        let key = key.clone();
        finish_if_dropped(
            async move { on_store!(&inner.store, ops => ops.read_record(&key).await) },
        )
        .await
    }

    async fn write_record(
        &self,
        key: &LockKey,
        lease_id: LeaseId,
        record: &Record,
        retention: Duration,
    ) -> Result<Ownership> {
        let retention_ms = Record::retention_millis(retention)?;
        let write = Arc::clone(&self.inner).write_record(
            key.clone(),
            lease_id,
            record.clone(),
            retention_ms,
        );
        // Finished even if the caller gives up, as `renew` is.
        finish_if_dropped(write).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two attempts of one lease run at once and the later one ends first (a retry that
    /// succeeded while the first attempt is still on its way): a release still waits for
    /// the first.
    #[tokio::test]
    async fn a_release_waits_for_every_running_attempt_of_its_lease() {
        let in_flight = Arc::new(InFlight::default());
        let lease = LeaseId::random();
        let first = in_flight.start(lease).await;
        let retry = in_flight.start(lease).await;
        drop(retry);
        let release = in_flight.wait_for(lease);
        tokio::pin!(release);
        let early = tokio::time::timeout(Duration::ZERO, &mut release).await;
        assert!(
            early.is_err(),
            "the release did not wait for the first attempt"
        );
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), release)
            .await
            .expect("the release goes on once every attempt ended");
        assert!(
            lock_unpoisoned(&in_flight.0).is_empty(),
            "an ended attempt left its gate"
        );
    }
}
