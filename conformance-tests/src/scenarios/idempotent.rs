//! Idempotent execution: work runs once per key across concurrent and retried callers,
//! and its result record is written fenced by the lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::backend::{AcquireRequest, LockBackendExt, Ownership, Record, MAX_RETENTION};
use lock_core::{ErrorKind, Execution, LockClient, LockKey, Renewal};
use tokio::sync::Notify;

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{expect_kind, within, Ctx, Failure, LinkControl, Outcome, SLACK};

type Run = lock_core::Result<Execution<String>>;

/// The work of the scenarios: counts its runs and returns `value`.
fn counted(
    runs: &Arc<AtomicUsize>,
    value: &'static [u8],
) -> impl FnOnce(lock_core::LockScope) -> std::future::Ready<Result<Vec<u8>, String>> {
    let runs = Arc::clone(runs);
    move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(value.to_vec()))
    }
}

/// Eight callers in separate clients at once: the work runs exactly once, and every
/// other caller gets its recorded result.
pub async fn idempotent_work_runs_once_across_concurrent_callers(ctx: &Ctx) -> Outcome {
    const CALLERS: usize = 8;
    let key = ctx.key("idempotent-concurrent");
    let runs = Arc::new(AtomicUsize::new(0));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (client, key, runs) = (ctx.client().await?, key.clone(), runs.clone());
        calls.spawn(async move {
            client
                .idempotent(&key)
                .wait_up_to(Duration::from_secs(30))
                .run(move |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Long enough for the others to arrive while it runs.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, String>(b"done".to_vec())
                })
                .await
        });
    }
    let mut ran = 0;
    while let Some(call) = within(Duration::from_secs(60), "the callers", calls.join_next()).await?
    {
        match call.map_err(|e| Failure(format!("a caller panicked: {e}")))?? {
            Execution::Ran(value) | Execution::Replayed(value) if value != b"done" => {
                return Err(Failure(format!("a caller got {value:?}")))
            }
            Execution::Ran(_) => ran += 1,
            Execution::Replayed(_) => {}
            other => return Err(Failure(format!("a waiting caller got {other:?}"))),
        }
    }
    ensure!(ran == 1, "{ran} callers reported running the work");
    ensure!(
        runs.load(Ordering::SeqCst) == 1,
        "the work ran {} times",
        runs.load(Ordering::SeqCst)
    );
    Ok(())
}

/// A retry gets the recorded result, with one store round trip and no lock taken.
pub async fn idempotent_replay_returns_the_recorded_result(ctx: &Ctx) -> Outcome {
    let key = ctx.key("idempotent-replay");
    let runs = Arc::new(AtomicUsize::new(0));
    let first: Run = ctx
        .client()
        .await?
        .idempotent(&key)
        .run(counted(&runs, b"result"))
        .await;
    ensure!(
        first? == Execution::Ran(b"result".to_vec()),
        "the first call did not run the work"
    );
    let (retrying, faulty) = ctx.faulty_client().await?;
    let retry: Run = retrying
        .idempotent(&key)
        .run(counted(&runs, b"other"))
        .await;
    ensure!(
        retry? == Execution::Replayed(b"result".to_vec()),
        "the retry did not replay the recorded result"
    );
    ensure!(
        runs.load(Ordering::SeqCst) == 1,
        "the retry ran the work again"
    );
    ensure!(
        faulty.total_calls() == 1 && faulty.calls(Op::Record) == 1,
        "the replay cost {} store calls ({} acquisitions), not one record read",
        faulty.total_calls(),
        faulty.calls(Op::Acquire)
    );
    Ok(())
}

/// A retry whose request fingerprint differs from the recorded run's is refused, and the
/// work is not run.
pub async fn idempotent_mismatch_is_refused(ctx: &Ctx) -> Outcome {
    let key = ctx.key("idempotent-mismatch");
    let client = ctx.client().await?;
    let runs = Arc::new(AtomicUsize::new(0));
    let first: Run = client
        .idempotent(&key)
        .fingerprint(b"request-a")
        .run(counted(&runs, b"a"))
        .await;
    ensure!(
        first? == Execution::Ran(b"a".to_vec()),
        "the first run did not run the work"
    );
    let other: Run = client
        .idempotent(&key)
        .fingerprint(b"request-b")
        .run(counted(&runs, b"b"))
        .await;
    expect_kind(
        other,
        ErrorKind::InvalidInput,
        "a retry with another fingerprint",
    )?;
    let same: Run = client
        .idempotent(&key)
        .fingerprint(b"request-a")
        .run(counted(&runs, b"a"))
        .await;
    ensure!(
        same? == Execution::Replayed(b"a".to_vec()),
        "the matching retry was not replayed"
    );
    ensure!(runs.load(Ordering::SeqCst) == 1, "the work ran again");
    Ok(())
}

/// A caller that does not wait learns that the work is in progress elsewhere; a failed run
/// records nothing and the next call runs the work again.
pub async fn idempotent_in_progress_and_failed_runs(ctx: &Ctx) -> Outcome {
    let key = ctx.key("idempotent-progress");
    let (first, second) = (ctx.client().await?, ctx.client().await?);
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let running = {
        let (key, started, finish) = (key.clone(), started.clone(), finish.clone());
        tokio::spawn(async move {
            first
                .idempotent(&key)
                .run(move |_| async move {
                    started.notify_one();
                    finish.notified().await;
                    Err::<Vec<u8>, _>("the work failed".to_string())
                })
                .await
        })
    };
    within(SLACK * 10, "the first run to start", started.notified()).await?;
    let meanwhile: Run = second
        .idempotent(&key)
        .run(|_| async { Ok(Vec::new()) })
        .await;
    ensure!(
        meanwhile? == Execution::InProgress,
        "a concurrent caller was not told InProgress"
    );
    finish.notify_one();
    let failed = within(SLACK * 10, "the failing run", running)
        .await?
        .map_err(|e| Failure(format!("the run panicked: {e}")))?;
    ensure!(
        failed? == Execution::Failed("the work failed".to_string()),
        "the failed run was not reported as failed"
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let again: Run = second
        .idempotent(&key)
        .run(counted(&runs, b"second try"))
        .await;
    ensure!(
        again? == Execution::Ran(b"second try".to_vec()),
        "the call after a failed run did not run the work"
    );
    Ok(())
}

/// The record write is fenced by the lock in the store: refused for a lease that does not
/// hold the key, or no longer does, accepted for the holder.
pub async fn record_write_needs_the_live_holder(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("idempotent-fence"))?;
    let backend = ctx.backend().await?;
    let request = AcquireRequest::new(key.clone(), ctx.long_ttl(), Duration::ZERO, Renewal::Manual);
    let lease = backend
        .acquire_once(&request, Duration::from_secs(5))
        .await?;
    let record = |value: &[u8]| Record {
        value: value.to_vec(),
        fingerprint: None,
        token: lease.token(),
    };
    let retention = Duration::from_secs(60);
    let stranger = lock_core::LeaseId::random();
    ensure!(
        backend
            .write_record(&key, stranger, &record(b"x"), retention)
            .await?
            == Ownership::NotHeld,
        "a lease that never held the key wrote a record"
    );
    ensure!(
        backend.read_record(&key).await?.is_none(),
        "a refused write left a record"
    );
    ensure!(
        backend
            .write_record(&key, lease.id(), &record(b"held"), retention)
            .await?
            .is_held(),
        "the holder's write was refused"
    );
    ensure!(
        backend.read_record(&key).await? == Some(record(b"held")),
        "the record did not read back as written"
    );
    let _ = backend.release(&key, lease.id()).await?;
    ensure!(
        backend
            .write_record(&key, lease.id(), &record(b"late"), retention)
            .await?
            == Ownership::NotHeld,
        "a released lease wrote a record"
    );
    ensure!(
        backend.read_record(&key).await? == Some(record(b"held")),
        "a refused late write changed the record"
    );
    Ok(())
}

/// The longest retention, [`MAX_RETENTION`], is kept by every store; a longer one is
/// invalid input, refused by the store's write and, through the client, before anything
/// is locked or run.
pub async fn record_retention_is_bounded(ctx: &Ctx) -> Outcome {
    let key = LockKey::new(ctx.key("idempotent-retention"))?;
    let backend = ctx.backend().await?;
    let request = AcquireRequest::new(key.clone(), ctx.long_ttl(), Duration::ZERO, Renewal::Manual);
    let lease = backend
        .acquire_once(&request, Duration::from_secs(5))
        .await?;
    let record = Record {
        value: b"kept".to_vec(),
        fingerprint: None,
        token: lease.token(),
    };
    let too_long = MAX_RETENTION + Duration::from_secs(1);
    expect_kind(
        backend
            .write_record(&key, lease.id(), &record, too_long)
            .await,
        ErrorKind::InvalidInput,
        "a write kept beyond MAX_RETENTION",
    )?;
    ensure!(
        backend.read_record(&key).await?.is_none(),
        "a refused write left a record"
    );
    ensure!(
        backend
            .write_record(&key, lease.id(), &record, MAX_RETENTION)
            .await?
            .is_held(),
        "the holder's write kept for MAX_RETENTION was refused"
    );
    ensure!(
        backend.read_record(&key).await? == Some(record),
        "the record kept for MAX_RETENTION did not read back"
    );
    let _ = backend.release(&key, lease.id()).await?;

    let runs = Arc::new(AtomicUsize::new(0));
    let run = ctx
        .client()
        .await?
        .idempotent(ctx.key("idempotent-retention-run"))
        .retention(too_long)
        .run(counted(&runs, b"never"))
        .await;
    expect_kind(
        run,
        ErrorKind::InvalidInput,
        "a run kept beyond MAX_RETENTION",
    )?;
    ensure!(
        runs.load(Ordering::SeqCst) == 0,
        "the work ran although its retention was refused"
    );
    Ok(())
}

/// A holder whose lock ran out (renewals failing) while its work ran cannot record its
/// result over the next holder's: it gets `Lost`, and retries replay the next holder's.
pub async fn late_record_of_a_lost_holder_is_refused(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    let lose = {
        let faulty = faulty.clone();
        move || faulty.inject(Op::Renew, Fault::Fail(ErrorKind::Unavailable))
    };
    late_record_refused(ctx, client, lose, move || faulty.heal()).await
}

/// The same with a session that ended while the link was cut.
pub async fn late_record_of_a_holder_whose_session_ended_is_refused(ctx: &Ctx) -> Outcome {
    let (client, link): (LockClient, Arc<dyn LinkControl>) = ctx.linked_client().await?;
    let cut = link.clone();
    late_record_refused(ctx, client, move || cut.cut(), move || link.restore()).await
}

async fn late_record_refused(
    ctx: &Ctx,
    client: LockClient,
    lose: impl FnOnce() + Send + 'static,
    heal: impl FnOnce() + Send + 'static,
) -> Outcome {
    let key = ctx.key("idempotent-late");
    let ttl = ctx.short_ttl();
    let (lost, proceed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let late = {
        let (key, lost, proceed) = (key.clone(), lost.clone(), proceed.clone());
        tokio::spawn(async move {
            client
                .idempotent(&key)
                .ttl(ttl)
                .run(move |scope| async move {
                    lose();
                    // Wait until the lease is gone locally, then for the rival's run.
                    while scope.is_held() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    lost.notify_one();
                    proceed.notified().await;
                    heal();
                    Ok::<_, String>(b"late".to_vec())
                })
                .await
        })
    };
    within(
        ttl * 3 + SLACK,
        "the first holder to lose its lock",
        lost.notified(),
    )
    .await?;
    let rival = ctx.client().await?;
    let rival_run: Run = within(
        ttl * 4 + SLACK,
        "the rival's run",
        rival
            .idempotent(&key)
            .wait_up_to(ttl * 4)
            .run(|_| async { Ok(b"rival".to_vec()) }),
    )
    .await?;
    ensure!(
        rival_run? == Execution::Ran(b"rival".to_vec()),
        "the rival did not run the work after the first holder lost its lock"
    );
    proceed.notify_one();
    let late_run = within(SLACK * 10, "the late holder's run", late)
        .await?
        .map_err(|e| Failure(format!("the late run panicked: {e}")))?;
    expect_kind(
        late_run,
        ErrorKind::Lost,
        "recording after the lock was lost",
    )?;
    let replay: Run = rival
        .idempotent(&key)
        .run(|_| async { Ok(Vec::new()) })
        .await;
    ensure!(
        replay? == Execution::Replayed(b"rival".to_vec()),
        "the late holder's result replaced the rival's"
    );
    Ok(())
}

/// A backend without records refuses idempotent runs without touching the store.
pub async fn idempotent_is_refused_without_records(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    let run: Run = client
        .idempotent(ctx.key("idempotent-unsupported"))
        .run(|_| async { Ok(Vec::new()) })
        .await;
    expect_kind(
        run,
        ErrorKind::Unsupported,
        "idempotent run without records",
    )?;
    ensure!(
        faulty.total_calls() == 0,
        "the refused run reached the store"
    );
    Ok(())
}
