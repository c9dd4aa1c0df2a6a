//! Leader election: one leader at a time, terms that only grow, a lost signal before any
//! successor, observers that end on the current leader.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::backend::lock_unpoisoned;
use lock_core::{ErrorKind, FencingToken, LeaderChanges};
use tokio::task::JoinSet;

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{
    eventually, expect_kind, join_all, released, within, Ctx, Failure, Outcome, SLACK,
};

/// One leadership as its leader saw it: from its election to the start of its
/// resignation, with its term.
#[derive(Clone, Copy, Debug)]
struct Tenure {
    from: Instant,
    to: Instant,
    term: FencingToken,
}

/// Three candidates campaign again and again: no two leaderships overlap (each from its
/// election to its resignation), terms grow with them, and while one leads `leader()`
/// shows its term and value.
pub async fn one_leader_at_a_time_with_increasing_terms(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-serial");
    let tenures = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = JoinSet::new();
    for candidate in 0..3 {
        let client = ctx.client().await?;
        let (name, tenures) = (name.clone(), tenures.clone());
        candidates.spawn(async move {
            for round in 0..4 {
                let value = format!("candidate {candidate}, round {round}");
                let leadership = client.elect(&name).value(value.as_bytes()).await?;
                let from = Instant::now();
                let seen = client.leader(&name).await?;
                let (term, shown) = seen
                    .map(|status| (status.term, status.value))
                    .ok_or_else(|| Failure("no leader while one leads".into()))?;
                ensure!(
                    term == leadership.term() && shown.as_deref() == Some(value.as_bytes()),
                    "leader() shows term {term} and {shown:?} while term {} leads with {value:?}",
                    leadership.term()
                );
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..5))).await;
                let to = Instant::now();
                lock_unpoisoned(&tenures).push(Tenure {
                    from,
                    to,
                    term: leadership.term(),
                });
                released(leadership.resign().await, "a leader resigning")?;
            }
            Ok::<(), Failure>(())
        });
    }
    join_all(Duration::from_secs(60), "candidates", &mut candidates).await?;
    let mut tenures = lock_unpoisoned(&tenures).clone();
    tenures.sort_by_key(|tenure| tenure.from);
    for pair in tenures.windows(2) {
        ensure!(
            pair[0].to <= pair[1].from,
            "two leaders at once: terms {} and {}",
            pair[0].term,
            pair[1].term
        );
        ensure!(
            pair[0].term < pair[1].term,
            "term {} followed term {}",
            pair[1].term,
            pair[0].term
        );
    }
    Ok(())
}

/// A leader whose renewals stop hearing back learns of its loss (`lost()`, and `run`
/// stops its body) before a successor is elected; the successor's term is greater, and
/// the old leader can no longer proclaim.
pub async fn leader_loses_before_a_successor_is_elected(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-loss");
    let ttl = ctx.short_ttl();
    let (client, faulty) = ctx.faulty_client().await?;
    let successor = ctx.client().await?;
    let leadership = client.elect(&name).ttl(ttl).value("old").await?;
    let old_term = leadership.term();
    faulty.inject(Op::Renew, Fault::BlackHole);
    faulty.inject(Op::Release, Fault::BlackHole);
    let campaign = tokio::spawn({
        let name = name.clone();
        async move {
            let elected = successor.elect(&name).value("new").await;
            (elected, Instant::now(), successor)
        }
    });
    let body = leadership.run(|_term| std::future::pending::<()>());
    let stopped = within(ttl * 3, "the leader's body stopped by the loss", body).await?;
    let stopped_at = Instant::now();
    expect_kind(stopped, ErrorKind::Lost, "a lost leader's run")?;
    let (elected, elected_at, _successor) = within(ttl * 10, "the successor's election", campaign)
        .await?
        .map_err(|err| Failure(format!("the successor's task panicked: {err}")))?;
    let elected = elected?;
    ensure!(
        stopped_at <= elected_at,
        "the successor was elected {:?} before the old leader stopped",
        stopped_at - elected_at
    );
    ensure!(
        elected.term() > old_term,
        "the successor's term {} is not above {old_term}",
        elected.term()
    );
    faulty.heal();
    released(elected.resign().await, "the successor")
}

/// A leader that resigns is replaced at once by a waiting candidate, not after its TTL.
pub async fn resigned_leader_is_replaced_at_once(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-resign");
    let client = ctx.client().await?;
    let waiting = ctx.client().await?;
    let leadership = client.elect(&name).value("first").await?;
    let campaign = tokio::spawn({
        let name = name.clone();
        async move { waiting.elect(&name).value("second").await }
    });
    // The candidate waits while the leader leads.
    tokio::time::sleep(Duration::from_millis(50)).await;
    ensure!(
        !campaign.is_finished(),
        "a candidate was elected beside a leader"
    );
    let resigned = Instant::now();
    released(leadership.resign().await, "the resignation")?;
    let next = within(SLACK * 3, "the waiting candidate's election", campaign)
        .await?
        .map_err(|err| Failure(format!("the candidate's task panicked: {err}")))??;
    let took = resigned.elapsed();
    ensure!(
        took < SLACK * 3,
        "the successor was elected {took:?} after the resignation"
    );
    released(next.resign().await, "the successor")
}

/// An observer tells the current leader first, then the changes in term order (a new
/// value within a term, a resignation, a successor), and ends on the current leader.
pub async fn observe_follows_the_terms_and_ends_on_the_current_leader(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-observe");
    let every = Duration::from_millis(50);
    let observer = ctx.client().await?;
    let one = ctx.client().await?;
    let two = ctx.client().await?;
    let mut changes = observer.observe(&name, every)?;
    let first = within(SLACK * 3, "the first look", changes.next()).await?;
    ensure!(
        first.is_none(),
        "the first look of a new election is {first:?}"
    );
    let leading = one.elect(&name).value("a").await?;
    let wanted = |term, value: &str| Some((term, Some(value.as_bytes().to_vec())));
    let mut last_term = FencingToken::new(0);
    // The election may be seen before its value is written: wait for the value.
    let mut told = next_told(&mut changes).await?;
    if told == Some((leading.term(), None)) {
        told = next_told(&mut changes).await?;
    }
    ensure!(
        told == wanted(leading.term(), "a"),
        "the observer told {told:?} for term {} leading with \"a\"",
        leading.term()
    );
    last_term = last_term.max(leading.term());
    leading.proclaim("a2").await?;
    let told = next_told(&mut changes).await?;
    ensure!(
        told == wanted(leading.term(), "a2"),
        "after a proclaim the observer told {told:?}"
    );
    let first_term = leading.term();
    released(leading.resign().await, "the first leader")?;
    let second = two.elect(&name).value("b").await?;
    // Whatever it tells in between (no leader, the new term before its value), terms do
    // not go back and it ends on the new leader with its value.
    loop {
        let told = next_told(&mut changes).await?;
        if let Some((term, _)) = &told {
            ensure!(*term >= last_term, "the observer went back to term {term}");
            last_term = *term;
        }
        if told == wanted(second.term(), "b") {
            break;
        }
    }
    ensure!(
        second.term() > first_term,
        "the second term is not above the first"
    );
    released(second.resign().await, "the second leader")?;
    let told = next_told(&mut changes).await?;
    ensure!(
        told.is_none(),
        "after the resignation the observer told {told:?}"
    );
    Ok(())
}

/// The next change an observer tells, within a bound: a term and its value, or no leader.
async fn next_told(
    changes: &mut LeaderChanges,
) -> Result<Option<(FencingToken, Option<Vec<u8>>)>, Failure> {
    let told = within(SLACK * 4, "the next change", changes.next()).await?;
    Ok(told.map(|status| (status.term, status.value)))
}

/// Campaigns cancelled at many points (elected or still waiting) leave no leader and no
/// candidate entry behind.
pub async fn cancelled_campaign_leaves_no_candidate(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-cancel");
    let client = ctx.client().await?;
    let observer = ctx.client().await?;
    for round in 0..6u64 {
        let campaign = client.elect(&name).value("cancelled").into_future();
        if let Ok(Ok(leadership)) =
            tokio::time::timeout(Duration::from_millis(round * 3), campaign).await
        {
            released(leadership.resign().await, "a campaign that won in time")?;
        }
    }
    eventually(
        SLACK * 3,
        "nobody leads after the cancelled campaigns",
        || async { Ok(observer.leader(&name).await?.is_none()) },
    )
    .await?;
    // Candidates cancelled while they wait behind a holder (of the lock: no record is
    // written under this name, so anything stored for it is a candidate's).
    let waited = ctx.key("election-cancel-waiting");
    let holder = observer.lock(&waited).await?;
    for round in 0..4u64 {
        let campaign = client.elect(&waited).into_future();
        ensure!(
            tokio::time::timeout(Duration::from_millis(20 + round * 15), campaign)
                .await
                .is_err(),
            "a candidate was elected while the name was held"
        );
    }
    released(holder.release().await, "the holder")?;
    eventually(
        SLACK * 3,
        "cancelled candidates leave the store",
        || async { Ok(ctx.factory().residue(&waited).await?.is_empty()) },
    )
    .await
}

/// A store without records refuses elections (the leader's value lives in one) with
/// `Unsupported`, holding nothing.
pub async fn election_is_refused_without_records(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-refused");
    let client = ctx.client().await?;
    expect_kind(
        client.elect(&name).value("v").await,
        ErrorKind::Unsupported,
        "a campaign",
    )?;
    expect_kind(
        client.leader(&name).await,
        ErrorKind::Unsupported,
        "leader()",
    )?;
    ensure!(
        client.inspect(&name).await?.is_none(),
        "a refused campaign holds the name"
    );
    Ok(())
}

/// A leader cut off from the store (a silent partition longer than its TTL) sees `lost()`
/// before a successor is elected; an observer follows the new term, and after the
/// partition heals the old leader's proclaim and resignation report the loss without
/// touching the successor.
pub async fn cut_off_leader_loses_before_a_successor_is_elected(ctx: &Ctx) -> Outcome {
    let name = ctx.key("election-partition");
    let ttl = ctx.short_ttl();
    let (client, link) = ctx.linked_client().await?;
    let successor = ctx.client().await?;
    let observer = ctx.client().await?;
    let leadership = client.elect(&name).ttl(ttl).value("old").await?;
    let mut changes = observer.observe(&name, Duration::from_millis(50))?;
    link.cut();
    let campaign = tokio::spawn({
        let name = name.clone();
        async move {
            let elected = successor.elect(&name).ttl(ttl).value("new").await;
            (elected, Instant::now())
        }
    });
    within(
        ttl + SLACK,
        "lost() during the partition",
        leadership.lost(),
    )
    .await?;
    let lost_at = Instant::now();
    let (elected, elected_at) = within(ttl * 10 + SLACK, "the successor's election", campaign)
        .await?
        .map_err(|err| Failure(format!("the successor's task panicked: {err}")))?;
    let elected = elected?;
    ensure!(
        lost_at <= elected_at,
        "the successor was elected {:?} before the old leader's loss",
        lost_at - elected_at
    );
    ensure!(
        elected.term() > leadership.term(),
        "the successor's term did not grow"
    );
    // The observer ends on the successor, terms never going back.
    let mut last = FencingToken::new(0);
    loop {
        let told = next_told(&mut changes).await?;
        if let Some((term, _)) = &told {
            ensure!(*term >= last, "the observer went back to term {term}");
            last = *term;
        }
        if told == Some((elected.term(), Some(b"new".to_vec()))) {
            break;
        }
    }
    link.restore();
    expect_kind(
        within(
            Duration::from_secs(10),
            "a proclaim after the loss",
            leadership.proclaim("late"),
        )
        .await?,
        ErrorKind::Lost,
        "the old leader's proclaim",
    )?;
    expect_kind(
        within(
            Duration::from_secs(10),
            "the old leader's resignation",
            leadership.resign(),
        )
        .await?,
        ErrorKind::Lost,
        "the old leader's resignation",
    )?;
    let leader = observer.leader(&name).await?;
    ensure!(
        leader
            .as_ref()
            .map(|status| (status.term, status.value.clone()))
            == Some((elected.term(), Some(b"new".to_vec()))),
        "after the old leader's calls the store says {leader:?}"
    );
    released(elected.resign().await, "the successor")
}
