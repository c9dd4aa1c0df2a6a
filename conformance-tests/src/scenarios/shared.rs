//! Semaphores and reader-writer locks: several leases hold one key, by the store's rules.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::lock_unpoisoned;
use lock_core::{
    AcquireOptions, ErrorKind, FencingToken, HoldKind, LockClient, LockGuard, Primitive, Renewal,
};
use tokio::task::JoinSet;

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{
    eventually, expect_kind, join_all, released, within, Ctx, Failure, Outcome, SLACK,
};

/// The semaphores' limit in these scenarios.
const LIMIT: u32 = 3;

/// One grant as its holder saw it: when the request was sent, when the grant arrived,
/// its token and how the key was held.
#[derive(Clone, Copy, Debug)]
struct Grant {
    sent: Instant,
    granted: Instant,
    token: FencingToken,
    kind: HoldKind,
}

/// Every grant that arrived before another's request was sent has a smaller token
/// (writes and permits: strictly; a read's token is at least the last write's).
fn check_token_order(grants: &[Grant]) -> Outcome {
    for later in grants {
        for earlier in grants.iter().filter(|earlier| earlier.granted < later.sent) {
            let ordered = match later.kind {
                HoldKind::Read if earlier.kind == HoldKind::Read => true,
                HoldKind::Read => earlier.token <= later.token,
                _ => earlier.token < later.token,
            };
            ensure!(
                ordered,
                "a {} granted with token {} after a {} with token {} was granted",
                later.kind.name(),
                later.token,
                earlier.kind.name(),
                earlier.token
            );
        }
    }
    Ok(())
}

/// Takes `kind` of `key` through `client` with `options`, noting the grant.
async fn take(
    client: &LockClient,
    key: &str,
    kind: HoldKind,
    options: AcquireOptions,
) -> Result<(LockGuard, Grant), Failure> {
    let sent = Instant::now();
    let request = match kind {
        HoldKind::Permit { limit } => client.semaphore(key, limit),
        HoldKind::Read => client.read_lock(key),
        HoldKind::Write => client.write_lock(key),
        HoldKind::Mutex => client.lock(key),
    };
    let guard = request.options(options).await?;
    let grant = Grant {
        sent,
        granted: Instant::now(),
        token: guard.token(),
        kind,
    };
    Ok((guard, grant))
}

/// Six clients take turns on a semaphore of three permits: at no moment do more than three
/// hold a permit (by a count of holders inside, and by the store's own list of holders),
/// and every permit's token is greater than those granted before it was asked for.
pub async fn semaphore_never_admits_more_than_its_limit(ctx: &Ctx) -> Outcome {
    let key = ctx.key("semaphore-limit");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut workers = JoinSet::new();
    for worker in 0..6 {
        let client = ctx.client().await?;
        let (key, inside, most, grants) =
            (key.clone(), inside.clone(), most.clone(), grants.clone());
        let options = ctx.options();
        workers.spawn(async move {
            for round in 0..6 {
                let kind = HoldKind::Permit { limit: LIMIT };
                let (permit, grant) = take(&client, &key, kind, options.clone()).await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                lock_unpoisoned(&grants).push(grant);
                if (worker + round) % 4 == 0 {
                    let holders = client.holders(&key, Primitive::Semaphore).await?;
                    ensure!(
                        holders.len() <= LIMIT as usize,
                        "the store lists {} holders of a {LIMIT}-permit semaphore",
                        holders.len()
                    );
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..6))).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                released(
                    permit.release().await,
                    "a permit was lost before its release",
                )?;
            }
            Ok::<(), Failure>(())
        });
    }
    join_all(Duration::from_secs(90), "permit holders", &mut workers).await?;
    let most = most.load(Ordering::SeqCst);
    ensure!(
        most <= LIMIT as usize,
        "{most} holders held permits at once; the limit is {LIMIT}"
    );
    let grants = lock_unpoisoned(&grants).clone();
    let mut tokens: Vec<_> = grants.iter().map(|grant| grant.token).collect();
    tokens.sort();
    tokens.dedup();
    ensure!(
        tokens.len() == grants.len(),
        "two permits were granted the same token"
    );
    check_token_order(&grants)
}

/// A semaphore admits exactly its limit: three holders at once (two through one client),
/// the fourth refused, a release admits it; the store lists the holders oldest first, and
/// nothing is left once all are released.
pub async fn semaphore_admits_exactly_its_limit(ctx: &Ctx) -> Outcome {
    let key = ctx.key("semaphore-exact");
    let one = ctx.client().await?;
    let other = ctx.client().await?;
    let late = ctx.client().await?;
    let first = one.semaphore(&key, LIMIT).await?;
    let second = one.semaphore(&key, LIMIT).await?;
    let third = other.semaphore(&key, LIMIT).await?;
    expect_kind(
        late.semaphore(&key, LIMIT).no_wait().await,
        ErrorKind::HeldByAnother,
        "a fourth permit of three",
    )?;
    let holders = late.holders(&key, Primitive::Semaphore).await?;
    let listed: Vec<_> = holders.iter().map(|status| status.token).collect();
    let granted = vec![first.token(), second.token(), third.token()];
    ensure!(
        listed == granted,
        "holders lists tokens {listed:?}, the permits were granted {granted:?} in that order"
    );
    ensure!(
        holders
            .iter()
            .all(|status| status.kind == HoldKind::Permit { limit: LIMIT }),
        "holders reports kinds {:?}",
        holders.iter().map(|status| status.kind).collect::<Vec<_>>()
    );
    ensure!(
        late.holders(&key, Primitive::Mutex).await?.is_empty()
            && late.holders(&key, Primitive::RwLock).await?.is_empty(),
        "the mutex or the reader-writer lock of the same name is held"
    );
    released(second.release().await, "the second permit")?;
    let fourth = late.semaphore(&key, LIMIT).no_wait().await?;
    ensure!(
        fourth.token() > third.token(),
        "the fourth permit's token {} is not above the third's {}",
        fourth.token(),
        third.token()
    );
    for permit in [first, third, fourth] {
        released(permit.release().await, "a permit")?;
    }
    eventually(
        SLACK,
        "nothing stored once every permit is released",
        || async { Ok(ctx.factory().residue(&key).await?.is_empty()) },
    )
    .await
}

/// The limit belongs to the semaphore while anyone holds it: another limit meanwhile is
/// refused, naming both; once it is empty a new limit is taken. Zero permits is refused.
pub async fn semaphore_limit_disagreement_is_refused(ctx: &Ctx) -> Outcome {
    let key = ctx.key("semaphore-disagreement");
    let client = ctx.client().await?;
    let other = ctx.client().await?;
    let held = client.semaphore(&key, 2).await?;
    let err = expect_kind(
        other.semaphore(&key, 5).no_wait().await,
        ErrorKind::InvalidInput,
        "a permit asked with another limit",
    )?;
    let message = err.to_string();
    ensure!(
        message.contains('2') && message.contains('5'),
        "the refusal does not name both limits: {message}"
    );
    expect_kind(
        other.semaphore(&key, 0).await,
        ErrorKind::InvalidInput,
        "a semaphore of zero permits",
    )?;
    released(held.release().await, "the permit")?;
    let changed = other.semaphore(&key, 5).no_wait().await?;
    released(changed.release().await, "a permit under the new limit")
}

/// A permit holder that stops renewing (a crash: nothing renews, nothing releases) frees its
/// permit by its TTL, not before, and its loss is signalled before a rival gets the permit.
pub async fn crashed_permit_holder_frees_its_permit_by_ttl(ctx: &Ctx) -> Outcome {
    let key = ctx.key("semaphore-crash");
    let ttl = ctx.short_ttl();
    let holder = ctx.client().await?;
    let steady = ctx.client().await?;
    let rival = ctx.client().await?;
    let kept = steady.semaphore(&key, 2).await?;
    let crashed = holder
        .semaphore(&key, 2)
        .ttl(ttl)
        .renewal(Renewal::Manual)
        .await?;
    let deadline = crashed.lease().valid_until();
    let lost = crashed.lost();
    std::mem::forget(crashed);
    let waiting = tokio::spawn(
        rival
            .semaphore(&key, 2)
            .wait_up_to(ttl * 10 + SLACK)
            .into_future(),
    );
    within(ttl + SLACK, "the crashed holder's lost()", lost).await?;
    let permit = within(ttl * 10 + SLACK * 2, "the rival's permit", waiting)
        .await?
        .map_err(|err| Failure(format!("the rival's task panicked: {err}")))??;
    let granted = Instant::now();
    ensure!(
        granted >= deadline,
        "the rival got the crashed holder's permit {:?} before its deadline",
        deadline - granted
    );
    ensure!(kept.is_held(), "the steady holder lost its permit");
    released(permit.release().await, "the rival's permit")?;
    released(kept.release().await, "the steady permit")
}

/// A permit holder whose renewals stop hearing back learns of its loss (`lost()`) before a
/// rival gets the permit: a holder never believes it holds a permit someone else has.
pub async fn permit_loss_precedes_the_rivals_grant(ctx: &Ctx) -> Outcome {
    let key = ctx.key("semaphore-lost-signal");
    let ttl = ctx.short_ttl();
    let (holder, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    let permit = holder.semaphore(&key, 1).ttl(ttl).await?;
    let renewals = faulty.calls(Op::Renew);
    eventually(ttl * 2, "a first renewal", || async {
        Ok(faulty.calls(Op::Renew) > renewals)
    })
    .await?;
    faulty.inject(Op::Renew, Fault::BlackHole);
    faulty.inject(Op::Release, Fault::BlackHole);
    let waiting = tokio::spawn(async move {
        let permit = rival.semaphore(&key, 1).wait_up_to(ttl * 8).await;
        (permit, Instant::now())
    });
    within(ttl * 3, "lost() after renewals stopped", permit.lost()).await?;
    let (taken, taken_at) = within(ttl * 9, "the rival's permit", waiting)
        .await?
        .map_err(|err| Failure(format!("the rival's task panicked: {err}")))?;
    let taken = taken?;
    let last = permit.lease();
    ensure!(
        last.valid_until() <= taken_at,
        "the rival got the permit {:?} before the holder's deadline",
        last.valid_until() - taken_at
    );
    ensure!(
        taken.token() > permit.token(),
        "the rival's token did not grow"
    );
    expect_kind(
        permit.release().await,
        ErrorKind::Lost,
        "the lost permit's release",
    )?;
    released(taken.release().await, "the rival's permit")
}

/// Readers share the lock and writers exclude everyone: two readers hold at once, a writer
/// is refused meanwhile and granted once they are gone, with a token above theirs; while it
/// writes, readers and writers are refused; a reader after it holds a token at least its.
pub async fn readers_share_and_writers_exclude(ctx: &Ctx) -> Outcome {
    let key = ctx.key("rw-basic");
    let one = ctx.client().await?;
    let other = ctx.client().await?;
    let reader = one.read_lock(&key).await?;
    let second_reader = other.read_lock(&key).no_wait().await?;
    let holders = one.holders(&key, Primitive::RwLock).await?;
    ensure!(
        holders.len() == 2 && holders.iter().all(|status| status.kind == HoldKind::Read),
        "two readers hold, the store lists {holders:?}"
    );
    expect_kind(
        other.write_lock(&key).no_wait().await,
        ErrorKind::HeldByAnother,
        "a writer while readers hold",
    )?;
    // The mutex of the same name is another key.
    let mutex = other.lock(&key).no_wait().await?;
    released(mutex.release().await, "the mutex of the same name")?;
    let reader_tokens = reader.token().max(second_reader.token());
    released(reader.release().await, "the first reader")?;
    released(second_reader.release().await, "the second reader")?;
    let writer = other.write_lock(&key).no_wait().await?;
    ensure!(
        writer.token() > reader_tokens,
        "the writer's token {} is not above the readers'",
        writer.token()
    );
    expect_kind(
        one.read_lock(&key).no_wait().await,
        ErrorKind::HeldByAnother,
        "a reader while a writer holds",
    )?;
    expect_kind(
        one.write_lock(&key).no_wait().await,
        ErrorKind::HeldByAnother,
        "a second writer",
    )?;
    let writer_token = writer.token();
    released(writer.release().await, "the writer")?;
    let reader = one.read_lock(&key).no_wait().await?;
    ensure!(
        reader.token() >= writer_token,
        "a reader after the writer holds token {} below the writer's {writer_token}",
        reader.token()
    );
    released(reader.release().await, "the last reader")?;
    eventually(
        SLACK,
        "nothing stored once every hold is released",
        || async { Ok(ctx.factory().residue(&key).await?.is_empty()) },
    )
    .await
}

/// Readers and writers of four clients over many rounds: a writer never holds with anyone
/// else, and tokens follow the grants (a write's above every earlier one, a read's at least
/// the last write's).
pub async fn readers_and_writers_never_overlap(ctx: &Ctx) -> Outcome {
    let key = ctx.key("rw-overlap");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut workers = JoinSet::new();
    for worker in 0..4 {
        let client = ctx.client().await?;
        let (key, readers, writers, overlapped, grants) = (
            key.clone(),
            readers.clone(),
            writers.clone(),
            overlapped.clone(),
            grants.clone(),
        );
        let options = ctx.options();
        workers.spawn(async move {
            for round in 0..8 {
                let kind = if (worker + round) % 3 == 0 {
                    HoldKind::Write
                } else {
                    HoldKind::Read
                };
                let (guard, grant) = take(&client, &key, kind, options.clone()).await?;
                let clash = match kind {
                    HoldKind::Write => {
                        writers.fetch_add(1, Ordering::SeqCst) != 0
                            || readers.load(Ordering::SeqCst) != 0
                    }
                    _ => {
                        readers.fetch_add(1, Ordering::SeqCst);
                        writers.load(Ordering::SeqCst) != 0
                    }
                };
                if clash {
                    overlapped.store(true, Ordering::SeqCst);
                }
                lock_unpoisoned(&grants).push(grant);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..5))).await;
                match kind {
                    HoldKind::Write => writers.fetch_sub(1, Ordering::SeqCst),
                    _ => readers.fetch_sub(1, Ordering::SeqCst),
                };
                released(guard.release().await, "a hold was lost before its release")?;
            }
            Ok::<(), Failure>(())
        });
    }
    join_all(Duration::from_secs(90), "readers and writers", &mut workers).await?;
    ensure!(
        !overlapped.load(Ordering::SeqCst),
        "a writer held the lock together with another holder"
    );
    let grants = lock_unpoisoned(&grants).clone();
    check_token_order(&grants)
}

/// Readers that keep overlapping cannot starve a writer: once it waits, new readers wait
/// behind it (a reader's single try is refused), and it is granted as soon as the readers
/// that held before it are gone.
pub async fn waiting_writer_is_not_starved_by_readers(ctx: &Ctx) -> Outcome {
    let key = ctx.key("rw-writer-preference");
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = JoinSet::new();
    let first_read = Arc::new(tokio::sync::Notify::new());
    for reader in 0..2u64 {
        let client = ctx.client().await?;
        let (key, stop, first_read) = (key.clone(), stop.clone(), first_read.clone());
        readers.spawn(async move {
            // Staggered, so one reader always holds while the other comes back.
            tokio::time::sleep(Duration::from_millis(40 * reader)).await;
            while !stop.load(Ordering::SeqCst) {
                let guard = client
                    .read_lock(&key)
                    .wait_up_to(Duration::from_secs(20))
                    .await?;
                first_read.notify_one();
                tokio::time::sleep(Duration::from_millis(80)).await;
                released(guard.release().await, "a reader")?;
            }
            Ok::<(), Failure>(())
        });
    }
    within(
        Duration::from_secs(10),
        "the first reader",
        first_read.notified(),
    )
    .await?;
    let writer_client = ctx.client().await?;
    let bound = Duration::from_secs(5);
    let writing = tokio::spawn({
        let key = key.clone();
        async move { writer_client.write_lock(&key).wait_up_to(bound).await }
    });
    let probe = ctx.client().await?;
    eventually(
        bound,
        "a new reader's try refused once the writer waits",
        || async {
            match probe.read_lock(&key).no_wait().await {
                Ok(guard) => {
                    released(guard.release().await, "a probing reader")?;
                    Ok(false)
                }
                Err(err) if err.kind() == ErrorKind::HeldByAnother => Ok(true),
                Err(err) => Err(err.into()),
            }
        },
    )
    .await?;
    let writer = within(bound + SLACK, "the waiting writer's grant", writing)
        .await?
        .map_err(|err| Failure(format!("the writer's task panicked: {err}")))?
        .map_err(|err| Failure(format!("the writer was starved by readers: {err}")))?;
    stop.store(true, Ordering::SeqCst);
    released(writer.release().await, "the writer")?;
    join_all(Duration::from_secs(30), "readers", &mut readers).await
}

/// Semaphore, read and write acquisitions cancelled at many points (their replies late, or
/// while they wait) leave no permit, writer intent or queue entry behind.
pub async fn cancelled_shared_acquisitions_leave_nothing(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    let observer = ctx.client().await?;
    faulty.inject(
        Op::Acquire,
        Fault::ApplyThenDelayReply(Duration::from_millis(40)),
    );
    let kinds = [
        ("semaphore", HoldKind::Permit { limit: 1 }),
        ("read", HoldKind::Read),
        ("write", HoldKind::Write),
    ];
    for (name, kind) in kinds {
        let key = ctx.key(&format!("cancel-{name}"));
        for round in 0..8u64 {
            let cancel_after = Duration::from_millis(round * 6);
            let attempt = take(&client, &key, kind, ctx.options());
            if let Ok(Ok((guard, _))) = tokio::time::timeout(cancel_after, attempt).await {
                guard.release().await?;
            }
            eventually(SLACK * 3, "a cancelled acquisition is released", || async {
                Ok(observer.holders(&key, kind.primitive()).await?.is_empty())
            })
            .await
            .map_err(|f| Failure(format!("{name}, round {round}: {f}")))?;
        }
    }
    faulty.heal();
    for (name, kind) in kinds {
        let key = ctx.key(&format!("cancel-{name}"));
        // What the cancelled waiters wait behind: the one permit, or the write lock.
        let blocking = match kind {
            HoldKind::Permit { .. } => kind,
            _ => HoldKind::Write,
        };
        let (holder, _) = take(&observer, &key, blocking, ctx.options()).await?;
        for round in 0..4u64 {
            let waiting = take(&client, &key, kind, ctx.options());
            ensure!(
                tokio::time::timeout(Duration::from_millis(20 + round * 15), waiting)
                    .await
                    .is_err(),
                "a {name} waiter was granted a held key"
            );
        }
        released(holder.release().await, "the blocking holder")?;
        // A cancelled writer's intent would keep readers out for its TTL.
        let (reader, _) = within(
            SLACK * 3,
            "a reader after cancelled waiters",
            take(&observer, &key, HoldKind::Read, ctx.options()),
        )
        .await??;
        released(reader.release().await, "the reader")?;
        eventually(SLACK * 3, "cancelled waiters leave the store", || async {
            Ok(ctx.factory().residue(&key).await?.is_empty())
        })
        .await
        .map_err(|f| Failure(format!("{name}: cancelled acquisitions left state: {f}")))?;
    }
    Ok(())
}

/// Through a reentrant owner a writer may also read (a downgrade, sharing its hold), and a
/// reader asking to write is refused at once with `InvalidInput`, not left to wait for
/// itself.
pub async fn owner_downgrades_but_never_upgrades(ctx: &Ctx) -> Outcome {
    let key = ctx.key("rw-owner");
    let client = ctx.client().await?;
    let owner = client.owner();
    let writer = owner.write_lock(&key).await?;
    let read = within(
        SLACK,
        "an owner's read under its own write",
        owner.read_lock(&key).into_future(),
    )
    .await??;
    ensure!(
        read.token() == writer.token(),
        "the downgrade's read holds another token than the write"
    );
    released(writer.release().await, "the write")?;
    ensure!(read.is_held(), "the read was lost with the write's release");
    let rival = ctx.client().await?;
    expect_kind(
        rival.read_lock(&key).no_wait().await,
        ErrorKind::HeldByAnother,
        "another client's read while the downgraded hold lives",
    )?;
    released(read.release().await, "the read")?;
    let reader = owner.read_lock(&key).await?;
    let started = Instant::now();
    expect_kind(
        owner
            .write_lock(&key)
            .wait_up_to(Duration::from_secs(30))
            .await,
        ErrorKind::InvalidInput,
        "an owner's write under its own read",
    )?;
    ensure!(
        started.elapsed() < SLACK,
        "the upgrade was refused only after {:?}",
        started.elapsed()
    );
    released(reader.release().await, "the reader")
}

/// A store without semaphores and reader-writer locks refuses them with `Unsupported`,
/// saying so, and holds nothing.
pub async fn shared_holds_are_refused_cleanly(ctx: &Ctx) -> Outcome {
    let key = ctx.key("shared-refused");
    let client = ctx.client().await?;
    for (what, attempt) in [
        ("a semaphore", client.semaphore(&key, 2).into_future().await),
        ("a read lock", client.read_lock(&key).into_future().await),
        ("a write lock", client.write_lock(&key).into_future().await),
    ] {
        let err = expect_kind(attempt, ErrorKind::Unsupported, what)?;
        ensure!(
            err.to_string()
                .contains(client.capabilities().shared_holds_refusal.unwrap_or("")),
            "the refusal of {what} does not say why: {err}"
        );
    }
    expect_kind(
        client.holders(&key, Primitive::Semaphore).await,
        ErrorKind::Unsupported,
        "holders of a semaphore",
    )?;
    ensure!(
        client.inspect(&key).await?.is_none(),
        "a refused request holds the key"
    );
    Ok(())
}

/// A permit holder cut off from the store (a silent partition longer than its TTL) sees
/// `lost()` no later than a rival is granted its permit, and the rival's token is greater;
/// once the partition heals, the old holder's release reports the loss and leaves the
/// rival's permit alone.
pub async fn cut_off_permit_holder_loses_before_a_rival_is_granted(ctx: &Ctx) -> Outcome {
    let key = ctx.key("semaphore-partition");
    let ttl = ctx.short_ttl();
    let (holder, link) = ctx.linked_client().await?;
    let rival = ctx.client().await?;
    let permit = holder.semaphore(&key, 1).ttl(ttl).await?;
    link.cut();
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            let permit = rival.semaphore(&key, 1).ttl(ttl).wait_up_to(ttl * 10).await;
            (permit, Instant::now())
        }
    });
    within(ttl + SLACK, "lost() during the partition", permit.lost()).await?;
    let lost_at = Instant::now();
    let (taken, taken_at) = within(ttl * 10 + SLACK, "the rival's permit", waiting)
        .await?
        .map_err(|err| Failure(format!("the rival's task panicked: {err}")))?;
    let taken = taken?;
    ensure!(
        permit.lease().valid_until() <= taken_at && lost_at <= taken_at,
        "the rival got the permit {:?} before the holder's deadline",
        permit
            .lease()
            .valid_until()
            .saturating_duration_since(taken_at)
    );
    ensure!(
        taken.token() > permit.token(),
        "the rival's token did not grow"
    );
    link.restore();
    let late = within(
        Duration::from_secs(10),
        "the old holder's release",
        permit.release(),
    )
    .await?;
    expect_kind(late, ErrorKind::Lost, "the cut-off holder's release")?;
    ensure!(taken.is_held(), "the rival lost its permit");
    let holders = ctx
        .client()
        .await?
        .holders(&key, Primitive::Semaphore)
        .await?;
    ensure!(
        holders.len() == 1 && holders[0].token == taken.token(),
        "after the old holder's release the store lists {holders:?}"
    );
    released(taken.release().await, "the rival's permit")
}
