//! Scenarios that need a real network store behind [`TcpFaultProxy`]s, called from the
//! backend crates' own test targets (the factory-based suite cannot place a proxy).

use std::time::Duration;

use lock_core::{ErrorKind, LockClient};

use crate::ensure;
use crate::harness::released;
use crate::harness::{eventually, expect_kind, within, Failure, Outcome, SLACK};
use crate::proxy::{ProxyMode, TcpFaultProxy};

/// Replies delayed on the wire past the TTL: `delayed` reaches the store only through
/// `proxies`, `direct` reaches it without them. A grant that arrives after its deadline is
/// never handed out (not waiting: "unavailable"; waiting: "unavailable" when the wait ends,
/// since every retry is as late), and the client's clean-up frees the key long before a
/// long TTL would. `ttl` must be shorter than the delayed round trip, which is at least
/// twice `delay`.
pub async fn grant_delayed_past_ttl_is_never_handed_out(
    delayed: &LockClient,
    direct: &LockClient,
    proxies: &[&TcpFaultProxy],
    key: &str,
    ttl: Duration,
    delay: Duration,
) -> Outcome {
    ensure!(delay * 2 > ttl, "the delay must outlast the TTL");
    // Connections made before the delay, so only the store's replies are late.
    let warm = delayed.lock(key).ttl(ttl).no_wait().await?;
    released(warm.release().await, "warm-up lease gone")?;
    for proxy in proxies {
        proxy.set_mode(ProxyMode::Delay(delay));
    }
    let not_waiting = within(
        delayed.defaults().request_timeout + SLACK,
        "an acquisition whose reply is late",
        delayed.lock(key).ttl(ttl).no_wait(),
    )
    .await?;
    if let Ok(guard) = &not_waiting {
        return Err(Failure(format!(
            "a grant that arrived after its deadline was handed out (held: {})",
            guard.is_held()
        )));
    }
    expect_kind(not_waiting, ErrorKind::Unavailable, "late grant, no wait")?;
    let bound = delay * 6;
    let waiting = within(
        bound + delayed.defaults().request_timeout + SLACK,
        "a bounded wait whose replies are all late",
        delayed.lock(key).ttl(ttl).wait_up_to(bound),
    )
    .await?;
    if let Ok(guard) = &waiting {
        return Err(Failure(format!(
            "a waiting acquisition handed out a late grant (held: {})",
            guard.is_held()
        )));
    }
    for proxy in proxies {
        proxy.set_mode(ProxyMode::Pass);
    }
    // Nothing of the late grants outlives its short TTL, and the key is free for others.
    let taken = within(
        SLACK * 10,
        "a direct client after the late grants",
        direct.lock(key).wait_up_to(SLACK * 10),
    )
    .await??;
    released(taken.release().await, "direct lease gone")?;
    eventually(SLACK * 3, "the key is free", || async {
        Ok(direct.inspect(key).await?.is_none())
    })
    .await
}
