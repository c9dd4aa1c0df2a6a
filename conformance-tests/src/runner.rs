//! Runs the scenarios as libtest-mimic trials and prints who passed what.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use lock_core::backend::lock_unpoisoned as lock;
use lock_core::backend::Store;

use crate::harness::{BackendFactory, Ctx};
use crate::holder_process::HolderTask;
use crate::scenarios::{Offers, ALL};

/// The longest one scenario may run before it counts as hung.
const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug)]
enum Status {
    NotRun,
    Passed,
    Failed,
    NotApplicable(&'static str),
}

/// Builds the factories with `setup` on the suite's runtime, registers every applicable
/// scenario for each as `conformance::<scenario>` (the backend is the test's kind), runs
/// the ones the command line selects, and prints a scenario x backend summary.
///
/// A factory that cannot be built (a missing server binary, say) fails the run: a backend
/// is never skipped silently. For a store that other processes can reach, use
/// [`run_suite_with`], which can start holders in other processes.
pub fn run_suite<F, Fut>(setup: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<Arc<dyn BackendFactory>>, String>>,
{
    run(None, setup)
}

/// [`run_suite`] for a backend whose [`Store`] entry connects by URL: a run of the test
/// binary started as a holder process by a scenario connects through `store` instead of
/// running the suite (and starts no server).
pub fn run_suite_with<F, Fut>(store: Store, setup: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<Arc<dyn BackendFactory>>, String>>,
{
    run(Some(store), setup)
}

/// How many scenarios run at once unless `--test-threads` says otherwise.
const SCENARIO_THREADS: usize = 4;

fn run<F, Fut>(store: Option<Store>, setup: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<Arc<dyn BackendFactory>>, String>>,
{
    if let Some(task) = HolderTask::from_env() {
        return HolderTask::run(task, store);
    }
    let mut args = Arguments::from_args();
    // Scenarios mostly wait (for TTLs, grants, servers), not compute: four at a time keep
    // a two-core machine busy without starving their timers, and halve a suite's wall
    // time against one scenario per core. `--test-threads` still decides.
    args.test_threads.get_or_insert(SCENARIO_THREADS);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(runtime) => Arc::new(runtime),
        Err(err) => {
            eprintln!("cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let factories = match runtime.block_on(setup()) {
        Ok(factories) => factories,
        Err(err) => {
            eprintln!("conformance setup failed: {err}");
            return ExitCode::FAILURE;
        }
    };
    let report: Arc<Mutex<BTreeMap<(String, &'static str), Status>>> = Arc::default();
    let mut trials = Vec::new();
    for factory in &factories {
        let backend = factory.name();
        let offers = match runtime.block_on(Offers::probe(factory.as_ref())) {
            Ok(probed) => probed,
            Err(err) => {
                eprintln!("cannot connect to {backend}: {err}");
                return ExitCode::FAILURE;
            }
        };
        trials.push(readme_row_trial(&runtime, factory, &offers));
        for scenario in ALL {
            let slot = (backend.clone(), scenario.name);
            if let Some(reason) = scenario.not_applicable(&offers) {
                lock(&report).insert(slot, Status::NotApplicable(reason));
                continue;
            }
            lock(&report).insert(slot.clone(), Status::NotRun);
            let (runtime, factory, caps, report) = (
                runtime.clone(),
                factory.clone(),
                offers.capabilities.clone(),
                report.clone(),
            );
            let trial = Trial::test(format!("conformance::{}", scenario.name), move || {
                let ctx = Ctx::new(factory, caps);
                let outcome = runtime.block_on(async {
                    let outcome = tokio::time::timeout(SCENARIO_LIMIT, (scenario.run)(&ctx)).await;
                    ctx.cleanup().await;
                    outcome
                });
                let (status, result) = match outcome {
                    Ok(Ok(())) => (Status::Passed, Ok(())),
                    Ok(Err(failure)) => (Status::Failed, Err(Failed::from(failure.0))),
                    Err(_) => (
                        Status::Failed,
                        Err(Failed::from(format!("hung for {SCENARIO_LIMIT:?}"))),
                    ),
                };
                lock(&report).insert(slot, status);
                result
            })
            .with_kind(backend.clone());
            trials.push(trial);
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    print_summary(&lock(&report));
    conclusion.exit_code()
}

/// `capabilities::readme_row`: the README's capability table has this backend's row as
/// its declared capabilities (and a holder-label probe) generate it.
fn readme_row_trial(
    runtime: &Arc<tokio::runtime::Runtime>,
    factory: &Arc<dyn BackendFactory>,
    offers: &Offers,
) -> Trial {
    let (runtime, factory, caps) = (
        runtime.clone(),
        factory.clone(),
        offers.capabilities.clone(),
    );
    let backend = factory.name();
    Trial::test("capabilities::readme_row", move || {
        let name = factory.name();
        let ctx = Ctx::new(factory, caps);
        runtime.block_on(async {
            let checked = crate::capability_table::check_readme_row(&ctx, &name).await;
            ctx.cleanup().await;
            checked.map_err(|failure| Failed::from(failure.0))
        })
    })
    .with_kind(backend)
}

fn print_summary(report: &BTreeMap<(String, &'static str), Status>) {
    let width = ALL.iter().map(|s| s.name.len()).max().unwrap_or(0);
    println!("\nconformance summary (scenario x backend):");
    for scenario in ALL {
        for ((backend, name), status) in report.iter().filter(|((_, n), _)| *n == scenario.name) {
            let shown = match status {
                Status::NotRun => "not run (filtered out)".to_string(),
                Status::Passed => "pass".to_string(),
                Status::Failed => "FAIL".to_string(),
                Status::NotApplicable(why) => format!("not applicable: {why}"),
            };
            println!("  {name:<width$}  {backend:<12} {shown}");
        }
    }
}
