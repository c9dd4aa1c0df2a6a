//! The lock backend over one SQL database.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    async_trait, finish_if_dropped, AcquireRequest, Capabilities, Error, ErrorKind, FencingToken,
    KeyWatch, LeaseId, LockBackend, LockInfo, LockKey, Result,
};

use crate::config::{Dialect, SqlConfig};
#[cfg(feature = "mysql")]
use crate::dialect::mysql;
#[cfg(feature = "postgres")]
use crate::dialect::postgres;
#[cfg(feature = "sqlite")]
use crate::dialect::sqlite;
use crate::dialect::{Ops, Statements};

/// After this many releases through one backend, expired rows of crashed holders that
/// nobody took over are deleted (one extra statement per this many releases).
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
    releases: AtomicU64,
    /// Acquire statements still running, by lease id: a release of that lease waits for
    /// its acquire to finish, so an acquisition cancelled mid-statement (whose statement
    /// the server may still apply) cannot be overtaken by the core's clean-up release.
    in_flight: std::sync::Mutex<HashMap<LeaseId, Arc<tokio::sync::Mutex<()>>>>,
    #[cfg(feature = "postgres")]
    notifier: std::sync::OnceLock<postgres::Notifier>,
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

impl SqlBackend {
    /// Connects with `config` and creates the lock table if it is missing
    /// ([`migrate`](Self::migrate)).
    pub async fn connect(config: SqlConfig) -> Result<Self> {
        let backend = Self::new(config)?;
        // PostgreSQL: the shared listener opens its own connection meanwhile, so the first
        // waiter finds it listening and the first lock call finds the migration's
        // connection idle in the pool.
        #[cfg(feature = "postgres")]
        backend.notifier();
        backend.migrate().await?;
        Ok(backend)
    }

    /// A backend for `config` that has not touched the database yet: connections are
    /// opened on first use, and the table must exist (see [`migrate`](Self::migrate)).
    /// Must be called inside a tokio runtime.
    pub fn new(config: SqlConfig) -> Result<Self> {
        crate::config::validate_table(&config.table)?;
        let dialect = config.dialect();
        let store = match dialect {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Store::Sqlite(Ops {
                pool: sqlite::pool(&config)?,
                sql: Statements::new(&sqlite::SQL, &config.table),
                dialect,
            }),
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Store::Postgres(Ops {
                pool: postgres::pool(&config)?,
                sql: Statements::new(&postgres::SQL, &config.table),
                dialect,
            }),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Store::MySql(Ops {
                pool: mysql::pool(&config)?,
                sql: Statements::new(&mysql::SQL, &config.table),
                dialect,
            }),
            #[allow(unreachable_patterns)]
            other => {
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
                    durable_fencing: true,
                    reentrancy: true,
                    session_bound: false,
                    min_ttl: Duration::from_millis(10),
                    max_ttl: Duration::from_secs(30 * 24 * 60 * 60),
                    ttl_granularity: Duration::from_millis(1),
                },
                config,
                releases: AtomicU64::new(0),
                in_flight: std::sync::Mutex::new(HashMap::new()),
                #[cfg(feature = "postgres")]
                notifier: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Creates the lock table and its fencing counter if they are missing. Idempotent and
    /// safe when many processes start at once; [`connect`](Self::connect) runs it.
    pub async fn migrate(&self) -> Result<()> {
        on_store!(&self.inner.store, ops => ops.migrate().await)
    }

    /// The dialect this backend speaks.
    pub fn dialect(&self) -> Dialect {
        self.inner.config.dialect()
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        &self.inner.config.table
    }

    /// Keys that have a row (held, or expired and not yet cleaned up) and start with
    /// `prefix`: for operators and for tests that check nothing is left behind.
    pub async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>> {
        on_store!(&self.inner.store, ops => ops.stored_keys(prefix).await)
    }

    /// Deletes the rows of expired leases nobody took over (crashed holders); returns how
    /// many. Runs by itself every 1024 releases; expired rows never block anyone.
    pub async fn sweep_expired(&self) -> Result<u64> {
        on_store!(&self.inner.store, ops => ops.sweep().await)
    }

    /// The acquire and release statements exactly as this backend sends them (with the
    /// table name and clock expression filled in): the baseline for benchmarks.
    pub fn statements(&self) -> (&str, &str) {
        on_store!(&self.inner.store, ops => (ops.sql.acquire_sql(), ops.sql.release_sql()))
    }

    /// The shared LISTEN task of a PostgreSQL backend, started on first use (inside a
    /// tokio runtime); `None` for other dialects.
    #[cfg(feature = "postgres")]
    // With only the `postgres` feature the store has no other variant.
    #[allow(irrefutable_let_patterns)]
    fn notifier(&self) -> Option<&postgres::Notifier> {
        let Store::Postgres(ops) = &self.inner.store else {
            return None;
        };
        Some(self.inner.notifier.get_or_init(|| {
            postgres::Notifier::start(
                ops.pool.clone(),
                crate::dialect::channel(&self.inner.config.table),
            )
        }))
    }

    fn ttl_ms(&self, ttl: Duration) -> Result<i64> {
        i64::try_from(self.inner.capabilities.store_ttl(ttl).as_millis())
            .map_err(|_| Error::new(ErrorKind::InvalidInput, format!("TTL {ttl:?} is too large")))
    }
}

fn in_flight(
    inner: &Inner,
) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Arc<tokio::sync::Mutex<()>>>> {
    inner
        .in_flight
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Option<FencingToken>> {
        let ttl_ms = self.ttl_ms(request.ttl())?;
        let lease_id = request.lease_id();
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let running = Arc::clone(&gate).lock_owned().await;
        in_flight(&self.inner).insert(lease_id, Arc::clone(&gate));
        // Runs to completion even if the caller gives up, then opens the gate.
        let inner = Arc::clone(&self.inner);
        let key = request.key().clone();
        finish_if_dropped(async move {
            let result = on_store!(&inner.store, ops => ops.acquire(&key, lease_id, ttl_ms).await);
            let mut in_flight = in_flight(&inner);
            if in_flight
                .get(&lease_id)
                .is_some_and(|g| Arc::ptr_eq(g, &gate))
            {
                in_flight.remove(&lease_id);
            }
            drop(running);
            result
        })
        .await
    }

    async fn renew(&self, key: &LockKey, lease_id: LeaseId, ttl: Duration) -> Result<bool> {
        let ttl_ms = self.ttl_ms(ttl)?;
        on_store!(&self.inner.store, ops => ops.renew(key, lease_id, ttl_ms).await)
    }

    async fn release(&self, key: &LockKey, lease_id: LeaseId) -> Result<bool> {
        let running = in_flight(&self.inner).get(&lease_id).cloned();
        if let Some(acquire) = running {
            drop(acquire.lock().await);
        }
        let released = on_store!(&self.inner.store, ops => ops.release(key, lease_id).await)?;
        if self.inner.releases.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            if let Err(err) = self.sweep_expired().await {
                tracing::debug!(error = %err, "sweeping expired leases failed");
            }
        }
        Ok(released)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        on_store!(&self.inner.store, ops => ops.inspect(key).await)
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Box<dyn KeyWatch>>> {
        #[cfg(feature = "postgres")]
        if let Some(notifier) = self.notifier() {
            return Ok(Some(notifier.subscribe(key.as_str()).await));
        }
        let _ = key;
        Ok(None)
    }
}
