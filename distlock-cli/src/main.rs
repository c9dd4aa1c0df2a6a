//! `distlock`, the command-line tool of distlock: run a command under a lock, see who
//! holds a lock, break a stuck one, compare the stores.
//!
//! ```sh
//! distlock run nightly -- ./report.sh          # waits for the lock, runs, releases
//! distlock run -n -E 0 backup -c 'make backup' # skip quietly (exit 0) if already running
//! distlock status nightly --json               # token, remaining TTL, waiters, holder
//! distlock list reports/                       # the held keys starting with reports/
//! distlock break nightly --token 41            # release a stuck holder by its token
//! distlock bench --svg bench.svg               # memory vs SQLite; add --store URL ...
//! ```
//!
//! Every store the `distlock` facade was built with is reachable by URL (`-s/--store`,
//! `$DISTLOCK_STORE`); with neither, a SQLite file in the user's data directory, so the
//! tool works with no server. The exit codes are listed in `distlock --help` and in the
//! repository's README.

mod bench;
mod break_lock;
mod child;
mod cli;
mod duration;
mod failure;
mod list;
mod run;
mod status;
mod store;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::failure::{Failure, UNAVAILABLE};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.verbose {
        init_tracing();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return report(Failure::new(
                UNAVAILABLE,
                format!("starting the runtime: {err}"),
            ))
        }
    };
    let outcome = runtime.block_on(async {
        let outcome = dispatch(cli).await;
        let _ = tokio::time::timeout(CLEANUP_GRACE, background_work_done()).await;
        outcome
    });
    // What is still running after the grace is cut off; the store's TTL ends any hold it
    // would have released.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => report(failure),
    }
}

/// How long distlock waits at exit for the library's background work: a release spawned
/// for an acquisition dropped by Ctrl-C while waiting (which may have been granted at that
/// moment), or for a lease found lost. Cut off, such a key stays held until its TTL. A
/// release normally takes milliseconds; the grace also covers the core's second release
/// of an abandoned acquisition (a request timeout later) only in part, since every Ctrl-C
/// during a wait would then take that long.
const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// Resolves once no task is left on the runtime (a signal such as a second Ctrl-C ends
/// the wait too), polled: tokio has no event for it.
async fn background_work_done() {
    let Ok(mut again) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
    else {
        return;
    };
    let metrics = tokio::runtime::Handle::current().metrics();
    while metrics.num_alive_tasks() > 0 {
        tokio::select! {
            _ = again.recv() => return,
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Run(args) => run::run(args, &store::resolve(&cli.stores)?).await,
        Command::Elect(args) => run::elect(args, &store::resolve(&cli.stores)?).await,
        Command::Status(args) => status::status(args, &store::resolve(&cli.stores)?).await,
        Command::List(args) => list::list(args, &store::resolve(&cli.stores)?).await,
        Command::Break(args) => break_lock::break_lock(args, &store::resolve(&cli.stores)?).await,
        Command::Bench(args) => bench::bench(args, cli.stores).await,
    }
}

/// Prints the failure's one line and gives its exit code.
fn report(failure: Failure) -> ExitCode {
    let _ = std::io::stdout().flush();
    eprintln!("distlock: {failure}");
    ExitCode::from(failure.code)
}

/// Tracing output on stderr: `RUST_LOG` if set, else the library's info and debug events.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,lock_core=debug,distlock=debug")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
