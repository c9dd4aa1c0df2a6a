//! Two OS processes contend on one SQLite file and on one PostgreSQL database: exclusion
//! holds across processes (a shared counter file updated with a read-pause-write under
//! the lock ends exact), and many processes open one new SQLite file together. (A holder
//! process killed is the conformance scenario
//! `killed_holder_process_hands_over_to_a_waiter`.)
//!
//! The second process is this test binary itself, re-run with `helper_process` selected
//! and its task in environment variables.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lock_core::{AcquireOptions, LockClient};

mod support;
use support::Database;

const TTL: Duration = Duration::from_millis(1000);
const ROUNDS: usize = 40;

fn options() -> AcquireOptions {
    AcquireOptions {
        ttl: TTL,
        ..AcquireOptions::default()
    }
}

/// Increments the number in `file` under the lock, slowly, `ROUNDS` times.
async fn count(client: &LockClient, key: &str, file: &Path) {
    for _ in 0..ROUNDS {
        let guard = client.lock(key).await.unwrap();
        let value: u64 = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        std::fs::write(file, (value + 1).to_string()).unwrap();
        guard.release().await.unwrap();
    }
}

/// The second process: does what `DISTLOCK_HELPER` says, or nothing when run as a test.
#[tokio::test]
async fn helper_process() {
    let Ok(task) = std::env::var("DISTLOCK_HELPER") else {
        return;
    };
    let url = std::env::var("DISTLOCK_HELPER_URL").unwrap();
    let key = std::env::var("DISTLOCK_HELPER_KEY").unwrap();
    let connect = || async {
        LockClient::new(lock_sql::connect(&url).await.unwrap()).with_defaults(options())
    };
    match task.as_str() {
        "count" => {
            let client = connect().await;
            let file = std::env::var("DISTLOCK_HELPER_FILE").unwrap();
            println!("READY");
            count(&client, &key, Path::new(&file)).await;
            println!("DONE");
        }
        "open" => {
            println!("READY");
            // Each line names a new database file that every opener opens at once.
            for line in std::io::stdin().lines() {
                let url = line.unwrap();
                let opened = async {
                    let backend = lock_sql::connect(&url).await?;
                    let client = LockClient::new(backend).with_defaults(options());
                    client.lock(&key).await?.release().await
                };
                match opened.await {
                    Ok(_) => println!("OPENED"),
                    Err(err) => println!("FAILED {err} ({err:?})"),
                }
            }
        }
        other => panic!("unknown helper task {other}"),
    }
}

fn spawn_helper(task: &str, url: &str, key: &str, file: Option<&Path>) -> (Child, impl BufRead) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "helper_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DISTLOCK_HELPER", task)
        .env("DISTLOCK_HELPER_URL", url)
        .env("DISTLOCK_HELPER_KEY", key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(file) = file {
        command.env("DISTLOCK_HELPER_FILE", file);
    }
    let mut child = command.spawn().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// Reads the helper's output until a line containing `prefix` (libtest may print its
/// "test helper_process ... " before it on the same line); returns the line from there.
fn wait_line(out: &mut impl BufRead, prefix: &str) -> String {
    wait_line_of(out, &[prefix])
}

/// Like [`wait_line`], for the first of several prefixes.
fn wait_line_of(out: &mut impl BufRead, prefixes: &[&str]) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "helper exited before {prefixes:?}"
        );
        if let Some(at) = prefixes.iter().find_map(|prefix| line.find(prefix)) {
            return line[at..].trim().to_owned();
        }
    }
}

async fn contend(db: &Database) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("counter");
    let key = format!("two-processes/{}", std::process::id());
    let (mut child, mut out) = spawn_helper("count", &db.url, &key, Some(&file));
    let client =
        LockClient::new(lock_sql::connect(&db.url).await.unwrap()).with_defaults(options());
    let reader = tokio::task::spawn_blocking(move || {
        wait_line(&mut out, "READY");
        wait_line(&mut out, "DONE");
        // Keep reading, so the helper's last words do not hit a closed pipe.
        std::io::copy(&mut out, &mut std::io::sink()).unwrap();
    });
    count(&client, &key, &file).await;
    reader.await.unwrap();
    assert!(child.wait().unwrap().success());
    let total: usize = std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(total, 2 * ROUNDS, "increments were lost: exclusion failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_processes_contend_on_a_new_file() {
    let db = Database::sqlite().await.unwrap();
    contend(&db).await;
}

/// Many processes open one new SQLite file at the same instant, round after round: every
/// one of them connects (creating the file, switching it to WAL and creating the table
/// together with the others) and can lock.
#[test]
fn sqlite_processes_open_a_new_file_together() {
    const PROCESSES: usize = 16;
    const ROUNDS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let key = format!("open-together/{}", std::process::id());
    let mut helpers: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_helper("open", "", &key, None))
        .collect();
    for (_, out) in &mut helpers {
        wait_line(out, "READY");
    }
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("{round}.db")).display()
        );
        for (child, _) in &mut helpers {
            writeln!(child.stdin.as_mut().unwrap(), "{url}").unwrap();
        }
        for (_, out) in &mut helpers {
            let outcome = wait_line_of(out, &["OPENED", "FAILED"]);
            if outcome.starts_with("FAILED") {
                failures.push(format!("round {round}: {outcome}"));
            }
        }
    }
    for (mut child, mut out) in helpers {
        drop(child.stdin.take());
        std::io::copy(&mut out, &mut std::io::sink()).unwrap();
        assert!(child.wait().unwrap().success());
    }
    assert!(
        failures.is_empty(),
        "{} of {} openings failed: {failures:#?}",
        failures.len(),
        PROCESSES * ROUNDS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_processes_contend() {
    let db = Database::postgres().await.unwrap();
    contend(&db).await;
}
