//! Lock sets: several keys held as one, all or none, without deadlock.

use std::future::IntoFuture;
use std::time::Duration;

use lock_core::{ErrorKind, LockClient};
use tokio::task::JoinSet;

use crate::ensure;
use crate::faults::{Fault, Op};
use crate::harness::{
    eventually, expect_kind, join_all, released, within, Ctx, Failure, Outcome, SLACK,
};

/// Whether nobody holds any of `keys`.
async fn all_free(client: &LockClient, keys: &[String]) -> Result<bool, Failure> {
    for key in keys {
        if client.inspect(key).await?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A set with one key held elsewhere is not granted, and holds none of its other keys
/// afterwards; once the key is free the whole set is granted, each key with the token the
/// store shows for it, and its release frees them all.
pub async fn lock_set_is_all_or_none(ctx: &Ctx) -> Outcome {
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|name| ctx.key(&format!("set-{name}")))
        .collect();
    let client = ctx.client().await?;
    let rival = ctx.client().await?;
    let blocker = rival.lock(&keys[1]).await?;
    expect_kind(
        client.lock_all(&keys).no_wait().await,
        ErrorKind::HeldByAnother,
        "a set with a held key, no wait",
    )?;
    expect_kind(
        client
            .lock_all(&keys)
            .wait_up_to(Duration::from_millis(200))
            .await,
        ErrorKind::TimedOut,
        "a set with a held key, a bounded wait",
    )?;
    let others = [keys[0].clone(), keys[2].clone()];
    eventually(SLACK, "a failed set holds none of its keys", || {
        all_free(&rival, &others)
    })
    .await?;
    released(blocker.release().await, "the blocking lock")?;
    let set = client.lock_all(&keys).await?;
    ensure!(set.is_held(), "a granted set is not held");
    for key in &keys {
        let status = rival.inspect(key).await?;
        ensure!(
            status.as_ref().map(|status| status.token) == set.token(key),
            "{key} is held with {status:?}, the set says token {:?}",
            set.token(key)
        );
    }
    released(set.release().await, "the set")?;
    ensure!(
        all_free(&rival, &keys).await?,
        "a released set still holds a key"
    );
    Ok(())
}

/// Two clients taking overlapping sets named in opposite orders, many times over, never
/// deadlock: the keys are taken in one canonical order.
pub async fn lock_sets_in_opposite_orders_do_not_deadlock(ctx: &Ctx) -> Outcome {
    let a = ctx.key("set-order-a");
    let b = ctx.key("set-order-b");
    let mut workers = JoinSet::new();
    for keys in [[a.clone(), b.clone()], [b, a]] {
        let client = ctx.client().await?;
        workers.spawn(async move {
            for _ in 0..10 {
                let set = client
                    .lock_all(&keys)
                    .wait_up_to(Duration::from_secs(30))
                    .await?;
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..4))).await;
                released(set.release().await, "a set")?;
            }
            Ok::<(), Failure>(())
        });
    }
    join_all(
        Duration::from_secs(60),
        "sets in opposite orders",
        &mut workers,
    )
    .await
}

/// A set whose acquisition is cancelled while it waits for its last key gives back the
/// keys it had taken.
pub async fn cancelled_lock_set_leaves_nothing(ctx: &Ctx) -> Outcome {
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|name| ctx.key(&format!("set-cancel-{name}")))
        .collect();
    let client = ctx.client().await?;
    let rival = ctx.client().await?;
    let blocker = rival.lock(&keys[2]).await?;
    let waiting = tokio::spawn(client.lock_all(&keys).into_future());
    eventually(
        Duration::from_secs(10),
        "the set takes its first keys",
        || async { Ok(rival.inspect(&keys[1]).await?.is_some()) },
    )
    .await?;
    waiting.abort();
    let taken = [keys[0].clone(), keys[1].clone()];
    eventually(SLACK * 3, "a cancelled set gives its keys back", || {
        all_free(&rival, &taken)
    })
    .await?;
    released(blocker.release().await, "the blocking lock")?;
    eventually(SLACK * 3, "nothing stored for the set's keys", || async {
        for key in &keys {
            if !ctx.factory().residue(key).await?.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

/// A set whose leases stop being renewed signals the loss (`lost()`, naming a key of the
/// set), is no longer held, and its release says it was lost.
pub async fn lost_member_fires_the_sets_lost(ctx: &Ctx) -> Outcome {
    let keys = [ctx.key("set-lost-a"), ctx.key("set-lost-b")];
    let ttl = ctx.short_ttl();
    let (client, faulty) = ctx.faulty_client().await?;
    let set = client.lock_all(&keys).ttl(ttl).await?;
    faulty.inject(Op::Renew, Fault::BlackHole);
    let (key, _) = within(ttl * 3, "the set's lost()", set.lost()).await?;
    ensure!(
        keys.iter().any(|name| name == key.as_str()),
        "lost() names {key:?}, not a key of the set"
    );
    ensure!(!set.is_held(), "is_held() after lost()");
    faulty.heal();
    expect_kind(
        set.release().await,
        ErrorKind::Lost,
        "the lost set's release",
    )?;
    Ok(())
}

/// On a store that takes a set in one step, a set waiting for one held key holds none of
/// the others meanwhile, and is granted whole once the key is free.
pub async fn atomic_lock_set_waits_holding_nothing(ctx: &Ctx) -> Outcome {
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|name| ctx.key(&format!("set-atomic-{name}")))
        .collect();
    let client = ctx.client().await?;
    let rival = ctx.client().await?;
    let blocker = rival.lock(&keys[2]).await?;
    let waiting = tokio::spawn(
        client
            .lock_all(&keys)
            .wait_up_to(Duration::from_secs(20))
            .into_future(),
    );
    let free = [keys[0].clone(), keys[1].clone()];
    // Several looks while the set waits (its attempts keep coming): none finds a key held.
    for _ in 0..10 {
        ensure!(
            all_free(&rival, &free).await?,
            "a waiting atomic set holds some of its keys"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(!waiting.is_finished(), "the set was granted a held key");
    released(blocker.release().await, "the blocking lock")?;
    let set = within(
        Duration::from_secs(10),
        "the set after the release",
        waiting,
    )
    .await?
    .map_err(|err| Failure(format!("the set's task panicked: {err}")))??;
    ensure!(set.is_held(), "the granted set is not held");
    released(set.release().await, "the set")
}
