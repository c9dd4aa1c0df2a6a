//! Several workers contend for one lock and print the fencing token of each turn.
//!
//! Each worker does a non-atomic read-sleep-write on a shared ledger that accepts writes
//! only with the newest token. With mutual exclusion no update is lost and tokens rise
//! strictly in the order the lock was held; the program checks both and exits non-zero
//! if either fails.
//!
//! `cargo run -p distlock --example contend [URL]` (default `memory://contend`).

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::FencedResource;

const WORKERS: usize = 4;
const TURNS: usize = 5;

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://contend".into());
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("FAILED: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<(), String> {
    let ledger = Arc::new(FencedResource::new(0usize));
    let turns = Arc::new(Mutex::new(Vec::new()));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let client = distlock::connect(url).await.map_err(|e| e.to_string())?;
        let (ledger, turns) = (ledger.clone(), turns.clone());
        workers.spawn(async move {
            for _ in 0..TURNS {
                let guard = client
                    .lock("demo/ledger")
                    .ttl(Duration::from_secs(10))
                    .await?;
                let token = guard.token();
                let seen = ledger.read(|count| *count);
                tokio::time::sleep(Duration::from_millis(5)).await;
                let written = ledger.write(token, |count| *count = seen + 1).is_ok();
                println!(
                    "worker {worker} holds token {token:>3}: ledger {seen} -> {}{}",
                    seen + 1,
                    if written { "" } else { " REFUSED" }
                );
                turns.lock().unwrap_or_else(|p| p.into_inner()).push(token);
                guard.release().await?;
            }
            Ok::<(), distlock::Error>(())
        });
    }
    while let Some(done) = workers.join_next().await {
        done.map_err(|e| format!("worker panicked: {e}"))?
            .map_err(|e| e.to_string())?;
    }
    let turns = turns.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let total = ledger.read(|count| *count);
    if total != WORKERS * TURNS {
        return Err(format!(
            "ledger is {total}, expected {}: updates were lost",
            WORKERS * TURNS
        ));
    }
    if !turns.windows(2).all(|pair| pair[0] < pair[1]) {
        return Err(format!("tokens did not rise in lock order: {turns:?}"));
    }
    println!(
        "{} turns, ledger {total}, tokens strictly increasing: exclusion held",
        turns.len()
    );
    Ok(())
}
