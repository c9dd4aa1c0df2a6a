//! Bad input is refused before the store is touched; hostile keys stay in their place;
//! many keys at once; nothing left behind.

use std::time::Duration;

use lock_core::backend::{
    default_drift_allowance, AcquireRequest, DynBackend, LockBackendExt, ReleaseOutcome,
};
use lock_core::{AcquireOptions, Backoff, ErrorKind, Lease, LeaseId, LockKey, Renewal};
use tokio::task::JoinSet;

use crate::ensure;
use crate::harness::released;
use crate::harness::{expect_kind, within, Ctx, Failure, Outcome, SLACK};

/// Empty, over-long and control-character keys are invalid input, and no call reaches the
/// store.
pub async fn invalid_keys_are_refused(ctx: &Ctx) -> Outcome {
    let (client, faulty) = ctx.faulty_client().await?;
    let too_long = format!("{}{}", ctx.prefix(), "k".repeat(LockKey::MAX_LEN));
    for key in [
        String::new(),
        too_long,
        format!("{}a\nb", ctx.prefix()),
        format!("{}nul\0", ctx.prefix()),
    ] {
        expect_kind(
            client.lock(&key).await,
            ErrorKind::InvalidInput,
            &format!("lock({key:?})"),
        )?;
        expect_kind(
            client.inspect(&key).await,
            ErrorKind::InvalidInput,
            &format!("inspect({key:?})"),
        )?;
        expect_kind(
            LockKey::new(&key),
            ErrorKind::InvalidInput,
            &format!("LockKey::new({key:?})"),
        )?;
    }
    ensure!(
        faulty.total_calls() == 0,
        "invalid keys reached the store ({} calls)",
        faulty.total_calls()
    );
    Ok(())
}

/// Zero, too short, too long and absurd TTLs (and a drift allowance that eats the whole
/// TTL) are invalid input, and no call reaches the store.
pub async fn invalid_ttls_are_refused(ctx: &Ctx) -> Outcome {
    let key = ctx.key("bad-ttl");
    let (client, faulty) = ctx.faulty_client().await?;
    let caps = ctx.capabilities().clone();
    let mut ttls = vec![
        Duration::ZERO,
        caps.max_ttl + caps.ttl_granularity,
        Duration::MAX,
    ];
    if caps.min_ttl > Duration::from_nanos(1) {
        ttls.push(caps.min_ttl - Duration::from_nanos(1));
    }
    for ttl in ttls {
        expect_kind(
            client.lock(&key).ttl(ttl).await,
            ErrorKind::InvalidInput,
            &format!("TTL {ttl:?}"),
        )?;
    }
    let ttl = ctx.short_ttl();
    let options = AcquireOptions {
        ttl,
        clock_drift: Some(ttl),
        ..ctx.options()
    };
    expect_kind(
        client.lock(&key).options(options).await,
        ErrorKind::InvalidInput,
        "drift allowance = TTL",
    )?;
    let request = AcquireRequest::new(
        LockKey::new(&key)?,
        Duration::ZERO,
        Duration::ZERO,
        Renewal::Manual,
    );
    expect_kind(
        faulty.acquire_once(&request, Duration::from_secs(1)).await,
        ErrorKind::InvalidInput,
        "acquire_once with TTL 0",
    )?;
    ensure!(
        faulty.total_calls() == 0,
        "invalid TTLs reached the store ({} calls)",
        faulty.total_calls()
    );
    Ok(())
}

/// Options that would make waiting a tight loop (a zero backoff) are invalid input;
/// options that mean "no limit" (`Duration::MAX` as a backoff cap or a wait bound) work
/// and never panic.
pub async fn extreme_options_are_refused_or_work(ctx: &Ctx) -> Outcome {
    let key = ctx.key("extreme-options");
    let (client, faulty) = ctx.faulty_client().await?;
    let rival = ctx.client().await?;
    for backoff in [
        Backoff {
            initial: Duration::ZERO,
            max: Duration::from_millis(10),
        },
        Backoff {
            initial: Duration::from_millis(1),
            max: Duration::ZERO,
        },
    ] {
        let options = AcquireOptions {
            backoff,
            ..ctx.options()
        };
        expect_kind(
            client.lock(&key).options(options).await,
            ErrorKind::InvalidInput,
            &format!("backoff {backoff:?}"),
        )?;
    }
    ensure!(
        faulty.total_calls() == 0,
        "refused options reached the store ({} calls)",
        faulty.total_calls()
    );
    let unlimited = AcquireOptions {
        backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::MAX,
        },
        ..ctx.options()
    };
    let held = rival.lock(&key).await?;
    let bound = Duration::from_millis(300);
    expect_kind(
        within(
            bound + SLACK,
            "a bounded wait with an unlimited backoff cap",
            client
                .lock(&key)
                .options(unlimited.clone())
                .wait_up_to(bound),
        )
        .await?,
        ErrorKind::TimedOut,
        "a bounded wait with an unlimited backoff cap",
    )?;
    released(held.release().await, "rival lost its lease")?;
    let guard = within(
        SLACK * 3,
        "an unbounded wait on a free key",
        client
            .lock(&key)
            .options(unlimited)
            .wait_up_to(Duration::MAX),
    )
    .await??;
    released(guard.release().await, "lease gone at release")?;
    Ok(())
}

/// The hostile names every store gets, besides its factory's
/// [`hostile_keys`](crate::harness::BackendFactory::hostile_keys).
const HOSTILE_NAMES: &[&str] = &[
    "../x", "/", "//", "*", "a*", "a?", "[ab]", "%", "_", "a%", "'", "\"", "';--", "\\", "\\\\'",
    "{tag}", "{", "}", "a b", " ", "$1", "KEYS[1]", "ARGV", "..", "%s%n", "ключ", "🔒", "é",
    "e\u{301}",
];

/// Keys beside the hostile ones that a pattern match, a trimmed or case-folded comparison
/// or an injected statement would hit: they must survive every hostile key's release.
const BYSTANDERS: &[&str] = &["a", "ab", "x"];

/// The hostile keys under the run's prefix, each once, in key order.
fn hostile_keys(ctx: &Ctx) -> Vec<String> {
    let mut names: Vec<String> = HOSTILE_NAMES
        .iter()
        .chain(ctx.factory().hostile_keys())
        .filter(|name| !BYSTANDERS.contains(name))
        .map(|name| ctx.key(name))
        .collect();
    // Exactly the longest key, in multi-byte characters.
    let room = LockKey::MAX_LEN - ctx.prefix().len();
    names.push(ctx.key(&("é".repeat(room / 2) + &"x".repeat(room % 2))));
    names.sort();
    names.dedup();
    names
}

/// Takes `key` for a fresh lease of `backend`.
async fn take(backend: &DynBackend, key: &str, ttl: Duration) -> Result<Lease, Failure> {
    let key = LockKey::new(key)?;
    let request = AcquireRequest::new(
        key.clone(),
        ttl,
        default_drift_allowance(ttl),
        Renewal::Manual,
    );
    backend
        .acquire_once(&request, Duration::from_secs(5))
        .await
        .map_err(|e| {
            Failure(format!(
                "locking {key:?}: {e} (a key collided with another or was mangled)"
            ))
        })
}

/// The keys `backend` lists as held under `prefix` (at most `limit`), with their leases.
async fn listed(
    backend: &DynBackend,
    prefix: &str,
    limit: usize,
) -> Result<Vec<(String, LeaseId)>, Failure> {
    Ok(backend
        .list_held(prefix, limit)
        .await?
        .into_iter()
        .map(|(key, info)| (key.as_str().to_owned(), info.lease_id))
        .collect())
}

/// Keys full of path, glob, Lua, SQL and hash-tag metacharacters, spaces, unicode and the
/// maximum length (and the names each store declares hostile to it) are distinct locks:
/// holding all of them at once works; the store keeps each under its own name, and lists
/// under any prefix exactly the keys that start with it, in key order (no wildcard,
/// case folding or collation widens, narrows or reorders the match); releasing them
/// touches no bystander, and leaves nothing behind.
pub async fn hostile_keys_stay_in_their_namespace(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.backend().await?, ctx.backend().await?);
    let ttl = ctx.long_ttl();
    let mut bystanders = Vec::new();
    for name in BYSTANDERS {
        bystanders.push(take(&a, &ctx.key(name), ttl).await?);
    }
    let mut leases = Vec::new();
    for key in hostile_keys(ctx) {
        leases.push(take(&a, &key, ttl).await?);
    }
    let mut held: Vec<(String, LeaseId)> = leases
        .iter()
        .chain(&bystanders)
        .map(|lease| (lease.key().as_str().to_owned(), lease.id()))
        .collect();
    held.sort();
    let held_keys: Vec<&str> = held.iter().map(|(key, _)| key.as_str()).collect();
    let stored = ctx.factory().residue(ctx.prefix()).await?;
    ensure!(
        stored == held_keys,
        "the store keeps {stored:?} for the held keys {held_keys:?} (mangled or merged)"
    );
    let all = listed(&b, ctx.prefix(), 1000).await?;
    ensure!(all == held, "list_held under the prefix: {all:?}");
    let first = listed(&b, ctx.prefix(), 3).await?;
    ensure!(first == held[..3], "list_held with a limit of 3: {first:?}");
    let narrower = ["a", "\\", "x{", "]]"].map(|name| format!("{}{name}", ctx.prefix()));
    let whole = ctx.prefix().trim_end_matches('/').to_owned();
    for sub in held_keys
        .iter()
        .copied()
        .chain(narrower.iter().map(String::as_str))
    {
        let expected: Vec<_> = held
            .iter()
            .filter(|(key, _)| key.starts_with(sub))
            .cloned()
            .collect();
        let got = listed(&b, sub, 1000).await?;
        ensure!(got == expected, "list_held({sub:?}) gave {got:?}");
    }
    ensure!(
        listed(&b, &whole, 1000).await? == held,
        "list_held({whole:?}) differs from list_held under the prefix"
    );
    for lease in &leases {
        let info = b
            .inspect(lease.key())
            .await?
            .ok_or_else(|| Failure(format!("{:?} is not held", lease.key())))?;
        ensure!(
            info.lease_id == lease.id(),
            "{:?} shows another lease",
            lease.key()
        );
        let rival = AcquireRequest::new(
            lease.key().clone(),
            ttl,
            default_drift_allowance(ttl),
            Renewal::Manual,
        );
        expect_kind(
            b.acquire_once(&rival, Duration::from_secs(5)).await,
            ErrorKind::HeldByAnother,
            &format!("rival on {:?}", lease.key()),
        )?;
    }
    for lease in &leases {
        release_only(&a, &b, lease).await?;
    }
    let left = ctx.factory().residue(ctx.prefix()).await?;
    let bystander_keys: Vec<&str> = bystanders.iter().map(|l| l.key().as_str()).collect();
    ensure!(
        left == bystander_keys,
        "after the hostile keys' release the store keeps {left:?}"
    );
    for lease in &bystanders {
        release_only(&a, &b, lease).await?;
    }
    let residue = ctx.factory().residue(ctx.prefix()).await?;
    ensure!(
        residue.is_empty(),
        "hostile keys left state behind: {residue:?}"
    );
    Ok(())
}

/// Releases `lease` through `a`, and checks through `b` that it is free now while the
/// bystanders, released last, still hold: a release that matched more than its key
/// would have freed them.
async fn release_only(a: &DynBackend, b: &DynBackend, lease: &Lease) -> Outcome {
    let outcome = a.release_lease(lease, Duration::from_secs(5)).await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "{:?} released as {outcome:?}",
        lease.key()
    );
    ensure!(
        b.inspect(lease.key()).await?.is_none(),
        "{:?} is still held after its release",
        lease.key()
    );
    Ok(())
}

const MANY: usize = 10_000;

/// Ten thousand distinct keys held at once by one client, all released cleanly.
///
/// Held through the client, renewed as users' locks are: taking and releasing this many
/// keys can outlast a TTL on a loaded machine (a ZooKeeper ensemble needed more than its
/// 40 s maximum), and a lease that nobody renews then expires in the middle of the check.
pub async fn ten_thousand_keys_held_at_once(ctx: &Ctx) -> Outcome {
    let client = ctx.client().await?;
    let prefix = format!("{}many/", ctx.prefix());
    let mut guards = Vec::with_capacity(MANY);
    let mut batch = JoinSet::new();
    for index in 0..MANY {
        let (client, key, options) = (client.clone(), format!("{prefix}{index}"), ctx.options());
        batch.spawn(async move { client.lock(&key).options(options).await });
        if batch.len() >= 64 || index + 1 == MANY {
            while let Some(done) = batch.join_next().await {
                guards.push(done.map_err(|e| Failure(format!("task failed: {e}")))??);
            }
        }
    }
    let distinct_keys: std::collections::HashSet<_> =
        guards.iter().map(|guard| guard.key().to_owned()).collect();
    ensure!(
        distinct_keys.len() == MANY,
        "only {} distinct keys were granted",
        distinct_keys.len()
    );
    for guard in guards.iter().step_by(97) {
        let status = client.inspect(guard.key()).await?;
        ensure!(
            status.map(|status| status.token) == Some(guard.token()),
            "{:?} is not held by its lease",
            guard.key()
        );
    }
    while !guards.is_empty() {
        let chunk: Vec<_> = guards.drain(..guards.len().min(64)).collect();
        let mut releases = JoinSet::new();
        for guard in chunk {
            releases.spawn(async move { guard.release().await });
        }
        while let Some(done) = releases.join_next().await {
            released(
                done.map_err(|e| Failure(format!("task failed: {e}")))?,
                "one of the ten thousand leases was gone at release",
            )?;
        }
    }
    let residue = ctx.factory().residue(&prefix).await?;
    ensure!(
        residue.is_empty(),
        "{} entries left behind, e.g. {:?}",
        residue.len(),
        residue.first()
    );
    Ok(())
}

/// A mixed workload (locks, renewals, releases, a timed-out waiter, a failed try-lock, a
/// re-entry, a dropped guard) leaves nothing in the store but documented counters.
pub async fn resource_hygiene(ctx: &Ctx) -> Outcome {
    let client = ctx.client().await?;
    let rival = ctx.client().await?;
    let key = ctx.key("hygiene");
    let guard = client.lock(&key).await?;
    guard.renew().await?;
    expect_kind(
        rival.try_lock(&key).await,
        ErrorKind::HeldByAnother,
        "rival try-lock",
    )?;
    expect_kind(
        rival
            .lock(&key)
            .wait_up_to(Duration::from_millis(100))
            .await,
        ErrorKind::TimedOut,
        "rival wait",
    )?;
    guard.release().await?;
    let owner = client.owner();
    let outer = owner.lock(&key).await?;
    let inner = owner.lock(&key).await?;
    inner.release().await?;
    outer.release().await?;
    let dropped_key = ctx.key("hygiene-dropped");
    drop(client.lock(&dropped_key).await?);
    crate::harness::eventually(Duration::from_secs(2), "dropped guard released", || async {
        Ok(client.inspect(&dropped_key).await?.is_none())
    })
    .await?;
    let residue = ctx.factory().residue(ctx.prefix()).await?;
    ensure!(residue.is_empty(), "left behind: {residue:?}");
    Ok(())
}
