//! Mutual exclusion, ownership history and fencing tokens.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{
    backend::{lock_unpoisoned, AcquireRequest, LockBackendExt},
    FencedResource, FencingToken, Renewal,
};
use tokio::task::JoinSet;

use crate::ensure;
use crate::harness::expect_kind;
use crate::harness::released;
use crate::harness::{eventually, join_all, within, Ctx, Failure, Outcome};
use lock_core::ErrorKind;

const CLIENTS: usize = 4;
const ROUNDS: usize = 8;

/// N clients x M rounds of a non-atomic read-sleep-write on a shared counter: any overlap
/// of two holders loses an increment and trips the overlap detector.
pub async fn mutual_exclusion(ctx: &Ctx) -> Outcome {
    let key = ctx.key("exclusion");
    let counter = Arc::new(Mutex::new(0usize));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let mut workers = JoinSet::new();
    for _ in 0..CLIENTS {
        let client = ctx.client().await?;
        let (key, counter, inside, overlapped) = (
            key.clone(),
            counter.clone(),
            inside.clone(),
            overlapped.clone(),
        );
        workers.spawn(async move {
            for _ in 0..ROUNDS {
                let guard = client.lock(&key).await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlapped.store(true, Ordering::SeqCst);
                }
                let seen = *lock_unpoisoned(&counter);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..4))).await;
                *lock_unpoisoned(&counter) = seen + 1;
                inside.fetch_sub(1, Ordering::SeqCst);
                released(
                    guard.release().await,
                    "a holder found its lease gone at release",
                )?;
            }
            Ok::<(), Failure>(())
        });
    }
    join_all(Duration::from_secs(60), "contending workers", &mut workers).await?;
    ensure!(
        !overlapped.load(Ordering::SeqCst),
        "two holders were inside the critical section at once"
    );
    let total = *lock_unpoisoned(&counter);
    ensure!(
        total == CLIENTS * ROUNDS,
        "lost updates: counter is {total}, expected {}",
        CLIENTS * ROUNDS
    );
    Ok(())
}

#[derive(Clone, Copy, Debug)]
struct Tenure {
    from: Instant,
    to: Instant,
    token: FencingToken,
}

/// Records every holder's tenure (from the grant's reply to the release call) and token:
/// ordered by start, no two tenures overlap and tokens strictly increase.
pub async fn history_is_serial_with_increasing_tokens(ctx: &Ctx) -> Outcome {
    let key = ctx.key("history");
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut workers = JoinSet::new();
    for _ in 0..3 {
        let client = ctx.client().await?;
        let (key, history) = (key.clone(), history.clone());
        workers.spawn(async move {
            for _ in 0..6 {
                let guard = client.lock(&key).await?;
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..3))).await;
                let to = Instant::now();
                lock_unpoisoned(&history).push(Tenure {
                    from,
                    to,
                    token: guard.token(),
                });
                guard.release().await?;
            }
            Ok::<(), Failure>(())
        });
    }
    join_all(Duration::from_secs(60), "contending workers", &mut workers).await?;
    let mut tenures = lock_unpoisoned(&history).clone();
    tenures.sort_by_key(|t| t.from);
    ensure!(
        tenures.len() == 18,
        "expected 18 tenures, got {}",
        tenures.len()
    );
    for pair in tenures.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        ensure!(a.to <= b.from, "tenures overlap: {a:?} and {b:?}");
        ensure!(
            a.token < b.token,
            "token did not increase between consecutive holders: {a:?} then {b:?}"
        );
    }
    Ok(())
}

/// Tokens strictly increase over releases and over takeovers of expired leases, and a
/// retried grant keeps its token.
pub async fn tokens_strictly_increase(ctx: &Ctx) -> Outcome {
    let key = lock_core::LockKey::new(ctx.key("tokens"))?;
    let (a, b) = (ctx.backend().await?, ctx.backend().await?);
    let ttl = ctx.short_ttl();
    let timeout = Duration::from_secs(5);
    let mut last: Option<FencingToken> = None;
    for round in 0..6 {
        let backend = if round % 2 == 0 { &a } else { &b };
        let request = AcquireRequest::new(
            key.clone(),
            ttl,
            lock_core::backend::default_drift_allowance(ttl),
            Renewal::Manual,
        );
        let lease = backend.acquire_once(&request, timeout).await?;
        let again = backend.acquire_once(&request, timeout).await?;
        ensure!(
            again.token() == lease.token(),
            "a retried grant changed the token: {} then {}",
            lease.token(),
            again.token()
        );
        if let Some(previous) = last {
            ensure!(
                lease.token() > previous,
                "token {} after {previous} (round {round})",
                lease.token()
            );
        }
        last = Some(lease.token());
        if round < 3 {
            backend.release_lease(&lease, timeout).await?;
        } else {
            // Let it expire: the next owner takes over without a release.
            let next = if round % 2 == 0 { &b } else { &a };
            eventually(ttl * 4, "expired lease becomes free", || async {
                Ok(next.inspect(&key).await?.is_none())
            })
            .await?;
        }
    }
    Ok(())
}

/// A holder whose lease expired still carries its old token; the fenced resource refuses
/// it once the next holder has written.
pub async fn stale_holder_is_fenced_out(ctx: &Ctx) -> Outcome {
    let key = ctx.key("fenced");
    let ttl = ctx.short_ttl();
    let (first, second) = (ctx.client().await?, ctx.client().await?);
    let resource = FencedResource::new(Vec::<&str>::new());
    let stale = first.lock(&key).ttl(ttl).renewal(Renewal::Manual).await?;
    resource
        .write(stale.token(), |log| log.push("first"))
        .map_err(|e| Failure(format!("the first holder's write was refused: {e}")))?;
    within(
        ttl + crate::harness::SLACK,
        "lost signal of the unrenewed lease",
        stale.lost(),
    )
    .await?;
    let fresh = second.lock(&key).wait_up_to(ttl * 4).await?;
    ensure!(
        fresh.token() > stale.token(),
        "new holder's token {} is not above {}",
        fresh.token(),
        stale.token()
    );
    resource
        .write(fresh.token(), |log| log.push("second"))
        .map_err(|e| Failure(format!("the new holder's write was refused: {e}")))?;
    ensure!(
        resource
            .write(stale.token(), |log| log.push("stale"))
            .is_err(),
        "the stale holder's write was accepted"
    );
    ensure!(
        resource.read(|log| log.clone()) == vec!["first", "second"],
        "resource holds {:?}",
        resource.read(|log| log.clone())
    );
    expect_kind(
        stale.release().await,
        ErrorKind::Lost,
        "releasing the lost lease reported it as still held",
    )?;
    released(fresh.release().await, "the new holder lost its lease")?;
    Ok(())
}
