//! The in-memory backend: the library's uncontended acquire+release cycle against the
//! backend's raw operations, 16 tasks on distinct keys, and 8 tasks on one key.
//!
//! Run with `cargo bench -p distlock-benches --bench memory`.

use std::time::Duration;

use distlock_benches::{contended, report, sample};
use lock_core::Renewal;
use lock_core::{
    backend::{AcquireRequest, LockBackend},
    LockClient, LockKey, MemoryBackend,
};

const CYCLES: usize = 20_000;
const TTL: Duration = Duration::from_secs(30);

fn main() {
    distlock_benches::runtime().block_on(async {
        let backend = MemoryBackend::new();
        let key = LockKey::new("bench/raw").expect("valid key");
        let raw = sample(CYCLES, || async {
            let request = AcquireRequest::new(key.clone(), TTL, Duration::ZERO, Renewal::Manual);
            backend.try_acquire(&request).await.expect("free key");
            let released = backend
                .release(&key, request.lease_id())
                .await
                .expect("held key");
            assert!(released.is_held());
        })
        .await;

        let client = LockClient::new(MemoryBackend::new());
        let library = sample(CYCLES, || async {
            let guard = client
                .try_lock("bench/library")
                .ttl(TTL)
                .await
                .expect("free key");
            guard.release().await.expect("held key");
        })
        .await;

        let distinct = contended(&client, 16, false, 500).await;
        let shared = contended(&client, 8, true, 500).await;

        report("raw try_acquire + release (uncontended)", &raw);
        report("library lock + release (uncontended)", &library);
        println!(
            "library / raw median ratio: {:.2}",
            library.median.as_secs_f64() / raw.median.as_secs_f64()
        );
        report("16 tasks, distinct keys, mean per cycle", &distinct);
        report("8 tasks, one key, mean per handover", &shared);
    });
}
