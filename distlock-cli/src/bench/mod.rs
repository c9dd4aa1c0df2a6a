//! `distlock bench`: the same workloads on each store, side by side in one run.

mod progress;
mod report;
mod shared;
mod stats;
mod svg;
mod workload;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use distlock::LockClient;

use crate::cli::BenchArgs;
use crate::failure::{Failure, UNAVAILABLE};
use crate::store;

use progress::Progress;
use report::StoreResult;
use workload::Plan;

/// Runs the workloads on every store (memory and a temporary SQLite file without
/// `--store`), then prints the table or JSON and writes the chart.
pub async fn bench(args: BenchArgs, stores: Vec<String>) -> Result<u8, Failure> {
    // Removed when the bench ends, whichever way.
    let mut scratch = None;
    let stores = if stores.is_empty() {
        default_stores(scratch.insert(ScratchDir::new()?))
    } else {
        stores
    };
    let unique = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let plan = Plan {
        runs: args.runs as usize,
        tasks: args.tasks as usize,
        duration: args.duration,
        ttl: args.ttl,
        prefix: format!("distlock-bench/{}-{unique}", std::process::id()),
    };
    let progress = Progress::start();
    let mut results = Vec::with_capacity(stores.len());
    for url in &stores {
        let measured = measure(&shared_memory(url), &plan, &progress).await;
        match measured {
            Ok(result) => results.push(result),
            Err(failure) => {
                progress.finish();
                return Err(failure);
            }
        }
    }
    progress.finish();
    if args.json {
        println!("{:#}", report::to_json(&plan, &results));
    } else {
        print!("{}", report::table(&plan, &results));
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::chart(&plan, &results)).map_err(|err| {
            Failure::new(
                UNAVAILABLE,
                format!("writing the chart to {}: {err}", path.display()),
            )
        })?;
    }
    Ok(0)
}

/// Every workload on one store (the shared ones where the store keeps shared holds).
async fn measure(url: &str, plan: &Plan, progress: &Progress) -> Result<StoreResult, Failure> {
    let shown = distlock::redact_url(url);
    let name = report::short_name(&shown);
    progress.store(&name);
    let failed = |err: distlock::Error| Failure::from_store_error(&err, url);
    let wanted = plan.tasks.max(shared::SEMAPHORE_TASKS);
    let mut clients: Vec<LockClient> = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        clients.push(store::connect(url).await?);
    }
    let uncontended = workload::uncontended(&clients[0], plan, progress)
        .await
        .map_err(failed)?;
    let distinct_keys = workload::distinct_keys(&clients[..plan.tasks], plan, progress)
        .await
        .map_err(failed)?;
    let one_key = workload::one_key(&clients[..plan.tasks], plan, progress)
        .await
        .map_err(failed)?;
    let shared = if clients[0].capabilities().shared_holds {
        Some(
            shared::measure(&clients, plan, progress)
                .await
                .map_err(failed)?,
        )
    } else {
        None
    };
    Ok(StoreResult {
        name,
        store: shown,
        uncontended,
        distinct_keys,
        one_key,
        shared,
    })
}

/// The stores that need no server.
fn default_stores(scratch: &ScratchDir) -> Vec<String> {
    vec![
        "memory://distlock-bench".to_string(),
        format!("sqlite://{}", scratch.path.join("bench.db").display()),
    ]
}

/// Each task connects on its own, so an unnamed memory store (one per `connect`) would
/// give every task a store of its own: name it.
fn shared_memory(url: &str) -> String {
    match url.strip_prefix("memory://") {
        Some("") => "memory://distlock-bench".to_string(),
        _ => url.to_string(),
    }
}

/// A temporary directory for the default SQLite store, removed at the end.
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn new() -> Result<Self, Failure> {
        let path = std::env::temp_dir().join(format!("distlock-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|err| {
            Failure::new(UNAVAILABLE, format!("creating {}: {err}", path.display()))
        })?;
        Ok(ScratchDir { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
