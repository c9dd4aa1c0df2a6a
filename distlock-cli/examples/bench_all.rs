//! `distlock bench` on every backend of this build, with private servers started for it.
//!
//! Starts PostgreSQL, MariaDB, Redis (one node, and three more for Redlock), etcd and
//! ZooKeeper on free loopback ports in temporary directories, through the conformance
//! suite's store fixture, then runs the `distlock` binary's `bench` against them plus
//! memory and a SQLite file, passing every argument through (`--svg FILE`, `--json`,
//! `--duration` ...).
//! The servers stop when it ends. The README's chart and docs/benchmarks.md come from:
//!
//! ```sh
//! cargo run --release -p distlock-cli --all-features --example bench_all -- --svg docs/bench.svg
//! ```

use std::process::{Command, ExitCode};

use conformance_tests::store_process::{
    StoreProcess, StoreSpec, MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER, POSTGRES_PASSWORD,
};

#[tokio::main]
async fn main() -> ExitCode {
    match bench_all().await {
        Ok(code) => code,
        Err(problem) => {
            eprintln!("bench_all: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn bench_all() -> Result<ExitCode, String> {
    let start = |name: &'static str, spec: StoreSpec| async move {
        StoreProcess::start(spec)
            .await
            .map_err(|err| format!("starting {name}: {err}"))
    };
    let postgres = start("PostgreSQL", StoreSpec::postgres()).await?;
    let mariadb = start("MariaDB", StoreSpec::mariadb()).await?;
    let redis = start("Redis", StoreSpec::redis()).await?;
    let mut redlock = Vec::new();
    for _ in 0..3 {
        redlock.push(start("Redis (Redlock node)", StoreSpec::redis()).await?);
    }
    let etcd = start(
        "etcd",
        StoreSpec::etcd().map_err(|err| format!("etcd: {err}"))?,
    )
    .await?;
    let zookeeper = start("ZooKeeper", StoreSpec::zookeeper()).await?;
    let scratch = tempfile::tempdir().map_err(|err| format!("a temp dir: {err}"))?;
    let redlock_nodes: Vec<String> = redlock.iter().map(|node| node.addr().to_string()).collect();
    let stores = [
        "memory://distlock-bench".to_string(),
        format!("sqlite://{}", scratch.path().join("bench.db").display()),
        format!(
            "postgres://postgres:{POSTGRES_PASSWORD}@{}/postgres?sslmode=disable",
            postgres.addr()
        ),
        format!(
            "mysql://{MARIADB_USER}:{MARIADB_PASSWORD}@{}/{MARIADB_DATABASE}",
            mariadb.addr()
        ),
        format!("redis://{}/0", redis.addr()),
        format!("redis+redlock://{}/0", redlock_nodes.join(",")),
        format!("etcd://{}/distlock-bench", etcd.addr()),
        format!("zk://{}", zookeeper.addr()),
    ];
    // The same build of the tool, with every backend: cargo passes itself as $CARGO.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(cargo);
    command.args([
        "run",
        "--release",
        "-q",
        "-p",
        "distlock-cli",
        "--all-features",
        "--",
        "bench",
    ]);
    for store in &stores {
        command.args(["--store", store]);
    }
    command.args(std::env::args().skip(1));
    let status = command
        .status()
        .map_err(|err| format!("running distlock bench: {err}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
