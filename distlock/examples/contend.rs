//! Several worker processes contend for one lock and print the fencing token of each turn.
//!
//! By default the workers share one SQLite file (no server needed). Inside the lock each
//! worker does a non-atomic read-sleep-write of a counter file and appends its token to a
//! log; with mutual exclusion no update is lost and the logged tokens rise strictly. The
//! program checks both and exits non-zero if either fails.
//!
//! ```sh
//! cargo run -p distlock --example contend            # SQLite file in a temp dir
//! cargo run -p distlock --example contend -- URL     # any store, e.g. postgres://...
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

const WORKERS: usize = 4;
const TURNS: usize = 5;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [flag, url, dir, id] if flag == "--worker" => worker(url, Path::new(dir), id).await,
        [] => coordinate(None).await,
        [url] => coordinate(Some(url.clone())).await,
        _ => Err("usage: contend [URL]".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("FAILED: {problem}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the worker processes on one store and checks what they did.
async fn coordinate(url: Option<String>) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("distlock-contend-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let url = url.unwrap_or_else(|| format!("sqlite://{}", dir.join("locks.db").display()));
    if url.starts_with("memory:") {
        return Err("memory:// stores live inside one process; give a shared store's URL".into());
    }
    println!(
        "{WORKERS} worker processes, {TURNS} turns each, on {}",
        distlock::redact_url(&url)
    );
    std::fs::write(dir.join("counter"), "0").map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for id in 0..WORKERS {
        let child = tokio::process::Command::new(&exe)
            .args([
                "--worker",
                &url,
                &dir.display().to_string(),
                &id.to_string(),
            ])
            .spawn()
            .map_err(|e| format!("starting worker {id}: {e}"))?;
        children.push(child);
    }
    for (id, mut child) in children.into_iter().enumerate() {
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("worker {id} failed: {status}"));
        }
    }
    let counter = read(&dir.join("counter"))?;
    let tokens: Vec<u64> = read(&dir.join("tokens"))?
        .lines()
        .map(|line| line.parse().map_err(|e| format!("bad token {line:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let _ = std::fs::remove_dir_all(&dir);
    if counter.trim() != (WORKERS * TURNS).to_string() {
        return Err(format!(
            "counter is {}, expected {}: updates were lost",
            counter.trim(),
            WORKERS * TURNS
        ));
    }
    if !tokens.windows(2).all(|pair| pair[0] < pair[1]) {
        return Err(format!("tokens did not rise in lock order: {tokens:?}"));
    }
    println!(
        "{} turns, counter {}, tokens strictly increasing: exclusion held",
        tokens.len(),
        counter.trim()
    );
    Ok(())
}

/// One worker process: take the lock, update the shared files, release, repeat.
async fn worker(url: &str, dir: &Path, id: &str) -> Result<(), String> {
    let client = distlock::connect(url).await.map_err(|e| e.to_string())?;
    for _ in 0..TURNS {
        let guard = client
            .lock("demo/ledger")
            .ttl(Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        let counter = dir.join("counter");
        let seen: usize = read(&counter)?
            .trim()
            .parse()
            .map_err(|e| format!("counter: {e}"))?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        write(&counter, &(seen + 1).to_string())?;
        append(&dir.join("tokens"), &format!("{}\n", guard.token()))?;
        println!(
            "worker {id} holds token {:>3}: counter {seen} -> {}",
            guard.token(),
            seen + 1
        );
        guard.release().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn read(path: &PathBuf) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn write(path: &PathBuf, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn append(path: &PathBuf, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("appending to {}: {e}", path.display()))
}
