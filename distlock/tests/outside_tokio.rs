//! `connect` polled outside a Tokio runtime (by another executor) is an error for every
//! scheme this build serves, not a panic from the store's client ("this functionality
//! requires a Tokio context" for SQLite) nor a client whose leases are never renewed.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};

use distlock::ErrorKind;

/// The smallest executor that is not Tokio: polls on this thread, parks between wakes.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

#[test]
fn connect_outside_a_runtime_is_an_error_for_every_scheme() {
    let dir = tempfile::tempdir().unwrap();
    for scheme in distlock::supported_schemes() {
        // Valid URLs, of servers that do not listen (ports 1 to 3): the refusal must come
        // before any store is touched.
        let url = match scheme {
            "memory" => "memory://outside-tokio".to_string(),
            "sqlite" => format!("sqlite://{}", dir.path().join("locks.db").display()),
            "redis+redlock" | "rediss+redlock" => {
                format!("{scheme}://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
            }
            _ => format!("{scheme}://user:hunter2@127.0.0.1:1/0"),
        };
        let err = match block_on(distlock::connect(&url)) {
            Ok(_) => panic!("{scheme}: connected outside a Tokio runtime"),
            Err(err) => err,
        };
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{scheme}: {err}");
        let text = err.to_string();
        assert!(text.contains("Tokio runtime"), "{scheme}: {text}");
        assert!(!text.contains("hunter2"), "{scheme}: {text}");
    }
}

/// A build without any backend crate has nothing to check here.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]
mod backend_crates {
    use super::block_on;
    use distlock::ErrorKind;

    /// A program may connect through a backend crate without the facade: each crate's own
    /// connect functions refuse in the same way, before any store is touched.
    #[test]
    fn a_backend_crates_connect_outside_a_runtime_is_an_error() {
        let mut checked = Checked::default();
        #[cfg(feature = "sqlite")]
        {
            use distlock::lock_sql::{connect, SqlBackend, SqlConfig};
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("locks.db").display());
            checked.refuses("lock_sql::connect", || block_on(connect(&url)).map(drop));
            let config = SqlConfig::from_url(&url).unwrap();
            checked.refuses("SqlBackend::new", || SqlBackend::new(config).map(drop));
        }
        #[cfg(feature = "postgres")]
        checked.refuses("lock_sql::connect (postgres)", || {
            block_on(distlock::lock_sql::connect(
                "postgres://u:hunter2@127.0.0.1:1/db",
            ))
            .map(drop)
        });
        #[cfg(feature = "mysql")]
        checked.refuses("lock_sql::connect (mysql)", || {
            block_on(distlock::lock_sql::connect(
                "mysql://u:hunter2@127.0.0.1:1/db",
            ))
            .map(drop)
        });
        #[cfg(feature = "redis")]
        {
            use distlock::lock_redis::{connect, RedisBackend, RedisConfig, RedlockBackend};
            let single = "redis://127.0.0.1:1";
            let nodes = "redis+redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3";
            checked.refuses("lock_redis::connect", || {
                block_on(connect(single)).map(drop)
            });
            checked.refuses("lock_redis::connect (redlock)", || {
                block_on(connect(nodes)).map(drop)
            });
            let single = RedisConfig::from_url(single).unwrap();
            let nodes = RedisConfig::from_url(nodes).unwrap();
            checked.refuses("RedisBackend::connect", || {
                block_on(RedisBackend::connect(&single)).map(drop)
            });
            checked.refuses("RedlockBackend::connect", || {
                block_on(RedlockBackend::connect(&nodes)).map(drop)
            });
        }
        #[cfg(feature = "etcd")]
        checked.refuses("lock_etcd::connect", || {
            block_on(distlock::lock_etcd::connect("etcd://127.0.0.1:1")).map(drop)
        });
        #[cfg(feature = "zookeeper")]
        checked.refuses("lock_zk::connect", || {
            block_on(distlock::lock_zk::connect("zk://127.0.0.1:1")).map(drop)
        });
        checked.assert_all_refused();
    }

    /// Connect entries checked one by one, so that one that panics does not hide the others.
    #[derive(Default)]
    struct Checked {
        entries: usize,
        failures: Vec<String>,
    }

    impl Checked {
        /// Calls `connect` outside a runtime and notes how it did not refuse, if it did not.
        fn refuses(&mut self, entry: &str, connect: impl FnOnce() -> distlock::Result<()>) {
            self.entries += 1;
            let failure = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(connect)) {
                Err(_) => "panicked".to_string(),
                Ok(Ok(())) => "connected".to_string(),
                Ok(Err(err)) if err.kind() != ErrorKind::InvalidInput => format!("failed: {err}"),
                Ok(Err(err)) if !err.to_string().contains("Tokio runtime") => {
                    format!("refused without naming the runtime: {err}")
                }
                Ok(Err(_)) => return,
            };
            self.failures.push(format!("{entry} {failure}"));
        }

        fn assert_all_refused(self) {
            assert!(self.entries > 0, "this build has no backend crate");
            assert!(self.failures.is_empty(), "{:#?}", self.failures);
        }
    }
}
