//! Semaphores and reader-writer locks on one server (the single-node backend, behind
//! Sentinel too): acquire, release and the holders are each one script, judged by the
//! server's clock like the mutex's; renewal goes through the mutex's batch
//! (`renew_many.lua`). The layout is in `scripts/shared.lua` and docs.md.

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::backend::{AcquireRequest, HolderInfo, Ownership};
use lock_core::{Error, ErrorKind, FencingToken, HoldKind, LeaseId, Result};
use redis::Script;

use crate::entry::{label_arg, ttl_millis};
use crate::error::unexpected_reply;
use crate::keys::{text_of_hex, SharedKeys};
use crate::node::{Node, Pinned};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/shared.lua"),
        include_str!("../scripts/token.lua"),
        include_str!("../scripts/shared_acquire.lua")
    ))
});
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/shared.lua"),
        include_str!("../scripts/shared_release.lua")
    ))
});
static HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/shared.lua"),
        include_str!("../scripts/shared_holders.lua")
    ))
});

/// Acquire answers (see `shared_acquire.lua`).
const GRANTED: i64 = 1;
const REFUSED: i64 = 0;
const OTHER_LIMIT: i64 = 2;

/// One attempt at `request`'s shared hold under `keys`, on `pinned` (so that a `WAIT`
/// after it covers the grant): the token when granted, `None` when refused (a waiting
/// writer's intent left behind), [`ErrorKind::InvalidInput`] when the semaphore's holders
/// asked with another limit.
pub(crate) async fn acquire(
    pinned: &Pinned<'_>,
    keys: &SharedKeys,
    request: &AcquireRequest,
) -> Result<Option<u64>> {
    let kind = request.key().kind();
    let limit = match kind {
        HoldKind::Permit { limit } => limit,
        _ => 0,
    };
    let (status, value): (i64, u64) = pinned
        .invoke(
            ACQUIRE
                .key(&keys.entries)
                .key(&keys.expiries)
                .key(&keys.intents)
                .key(&keys.fence)
                .arg(request.lease_id().to_string())
                .arg(ttl_millis(request.store_ttl()))
                .arg(kind.name())
                .arg(limit)
                .arg(label_arg(request.holder_label()))
                .arg(if request.waits() { "1" } else { "0" }),
            "acquire",
        )
        .await?;
    match status {
        GRANTED if value > 0 => Ok(Some(value)),
        REFUSED => Ok(None),
        OTHER_LIMIT => Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "semaphore {:?} is held with a limit of {value}, and this request asked for a \
                 limit of {limit}: the limit changes only once every holder has released",
                request.key().as_str()
            ),
        )),
        _ => Err(unexpected_reply("acquire", pinned.node().shown())),
    }
}

/// Removes `lease_id`'s entry and writer intent under `keys`, waking the key's waiters;
/// [`Ownership::NotHeld`] when the lease did not hold the key (an intent alone included).
pub(crate) async fn release(
    node: &Node,
    keys: &SharedKeys,
    lease_id: LeaseId,
    channel: &str,
) -> Result<Ownership> {
    let released: i64 = node
        .invoke(
            RELEASE
                .key(&keys.entries)
                .key(&keys.expiries)
                .key(&keys.intents)
                .arg(lease_id.to_string())
                .arg(channel),
            "release",
        )
        .await?;
    Ok(Ownership::held_if(released == 1))
}

/// Every live holder under `keys`, oldest grant (lowest token) first.
pub(crate) async fn holders(node: &Node, keys: &SharedKeys) -> Result<Vec<HolderInfo>> {
    let reply: Vec<(String, String, i64)> = node
        .invoke(HOLDERS.key(&keys.entries).key(&keys.expiries), "holders")
        .await?;
    let mut holders = reply
        .into_iter()
        .map(|(lease, entry, remaining)| parse_holder(&lease, &entry, remaining))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| unexpected_reply("holders", node.shown()))?;
    holders.sort_by_key(|holder| holder.token);
    Ok(holders)
}

/// A holder as the scripts store it (`<kind>:<token>:<limit>:<label hex>` under its lease
/// id) with its remaining milliseconds; `None` when malformed.
fn parse_holder(lease: &str, entry: &str, remaining_ms: i64) -> Option<HolderInfo> {
    let mut parts = entry.splitn(4, ':');
    let kind = parts.next()?;
    let token: u64 = parts.next()?.parse().ok()?;
    let limit: u32 = parts.next()?.parse().ok()?;
    let label = parts.next()?;
    let kind = match kind {
        "permit" => HoldKind::Permit { limit },
        "read" => HoldKind::Read,
        "write" => HoldKind::Write,
        _ => return None,
    };
    Some(HolderInfo {
        lease_id: lease.parse().ok()?,
        token: FencingToken::new(token),
        remaining_ttl: Duration::from_millis(remaining_ms.max(0).unsigned_abs()),
        waiters: None,
        holder: (!label.is_empty()).then(|| text_of_hex(label)).flatten(),
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_parse_as_the_scripts_write_them() {
        let lease = LeaseId::from_u128(0xabc);
        let permit = parse_holder(&lease.to_string(), "permit:42:3:", 1500).unwrap();
        assert_eq!(permit.lease_id, lease);
        assert_eq!(permit.token, FencingToken::new(42));
        assert_eq!(permit.kind, HoldKind::Permit { limit: 3 });
        assert_eq!(permit.remaining_ttl, Duration::from_millis(1500));
        assert_eq!(permit.holder, None);
        let label = label_arg(Some("host:1 ü"));
        let read = parse_holder(&lease.to_string(), &format!("read:7:0:{label}"), 3).unwrap();
        assert_eq!(read.kind, HoldKind::Read);
        assert_eq!(read.holder.as_deref(), Some("host:1 ü"));
        let write = parse_holder(&lease.to_string(), "write:8:0:", 0).unwrap();
        assert_eq!(write.kind, HoldKind::Write);
        assert!(parse_holder(&lease.to_string(), "mutex:8:0:", 0).is_none());
        assert!(parse_holder("not a lease", "write:8:0:", 0).is_none());
        assert!(parse_holder(&lease.to_string(), "write:8", 0).is_none());
    }
}
