//! A lock as one server stores it, and the owner-only operations both backends run on one
//! server: read the holder, renew many leases, release.
//!
//! An entry is the string `<lease id>:<token>:<stamp>`, followed by `:<holder label>` when
//! the lease has one (its UTF-8 bytes in hex, so it never holds a `:`), under the key's
//! lock key, with the lease's TTL as the key's expiry. The stamp is 0 on a single node and
//! the acquisition attempt under Redlock (see `redlock.rs`); every script here matches the
//! lease id only, so they serve both backends alike.

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::future::try_join_all;
use lock_core::backend::{HolderInfo, LeaseRenewal, Ownership};
use lock_core::{FencingToken, LeaseId, Result};
use redis::Script;

use crate::error::unexpected_reply;
use crate::keys::{push_hex, text_of_hex, Layout};
use crate::node::{Node, Pinned};

static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
static RENEW_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/shared.lua"),
        include_str!("../scripts/renew_many.lua")
    ))
});
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));

/// Most leases one `renew_many.lua` call renews, so one script never holds the server up
/// for long; a larger batch goes as several calls, pipelined on the node's connection.
const RENEWALS_PER_SCRIPT: usize = 1000;

/// The parts of an entry the client reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) lease_id: LeaseId,
    pub(crate) token: u64,
}

impl Entry {
    fn parse(value: &str) -> Option<Entry> {
        let mut parts = value.split(':');
        let lease_id = parts.next()?.parse().ok()?;
        let token = parts.next()?.parse().ok()?;
        Some(Entry { lease_id, token })
    }
}

/// A live entry on one server, and how long that server keeps it yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) entry: Entry,
    pub(crate) remaining_ttl: Duration,
    /// The holder label the entry carries.
    pub(crate) label: Option<String>,
}

impl Held {
    /// The holder as the core sees it (the server keeps no queue).
    pub(crate) fn into_info(self) -> HolderInfo {
        HolderInfo {
            lease_id: self.entry.lease_id,
            token: FencingToken::new(self.entry.token),
            remaining_ttl: self.remaining_ttl,
            waiters: None,
            holder: self.label,
            kind: lock_core::HoldKind::Mutex,
        }
    }
}

/// A holder label as the acquire scripts take it: its UTF-8 bytes in hex, `""` for none.
pub(crate) fn label_arg(label: Option<&str>) -> String {
    let mut hex = String::new();
    push_hex(&mut hex, label.unwrap_or_default());
    hex
}

/// The holder label after an entry's stamp; `None` when it has none (or an entry of an
/// older version, or one that does not decode).
fn label_of(value: &str) -> Option<String> {
    let hex = value.splitn(4, ':').nth(3).filter(|hex| !hex.is_empty())?;
    text_of_hex(hex)
}

/// A store TTL (already rounded up to whole milliseconds by the core) as the milliseconds
/// the scripts pass to `PX`/`PEXPIRE`.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// The live entry under `lock_key` on `node`, read with its remaining TTL in one step so
/// the two belong together; `None` when the key is free.
pub(crate) async fn read_holder(node: &Node, lock_key: &str) -> Result<Option<Held>> {
    let reply: (String, i64) = node.invoke(&INSPECT.key(lock_key), "inspect").await?;
    parse_holder(reply).ok_or_else(|| unexpected_reply("inspect", node.shown()))
}

/// Reads an inspect script reply; `None` when it is malformed.
fn parse_holder((value, pttl): (String, i64)) -> Option<Option<Held>> {
    if value.is_empty() {
        return Some(None);
    }
    Some(Some(Held {
        entry: Entry::parse(&value)?,
        // PTTL rounds down: 0 means under a millisecond left, and the entry is still live
        // (a renewal now would still find it), so it must not be reported free yet.
        remaining_ttl: Duration::from_millis(pttl.max(0).unsigned_abs()),
        label: label_of(&value),
    }))
}

/// Extends each of `leases` on `node` whose entry is still that lease's (a mutex entry,
/// or one holder of a shared key), answering for each in order whether it was. As few script calls as [`RENEWALS_PER_SCRIPT`] allows:
/// one for any batch the core's renewal engine sends.
pub(crate) async fn renew_if_owner(
    node: &Node,
    layout: &Layout,
    leases: &[LeaseRenewal],
) -> Result<Vec<Ownership>> {
    renew_if_owner_on(&node.pin().await?, layout, leases).await
}

/// [`renew_if_owner`] on one connection, so a `WAIT` sent on it afterwards covers every
/// renewal.
pub(crate) async fn renew_if_owner_on(
    node: &Pinned<'_>,
    layout: &Layout,
    leases: &[LeaseRenewal],
) -> Result<Vec<Ownership>> {
    let calls = leases.chunks(RENEWALS_PER_SCRIPT).map(|chunk| async move {
        let mut invocation = RENEW_MANY.prepare_invoke();
        for lease in chunk {
            invocation
                .arg(lease.lease_id.to_string())
                .arg(ttl_millis(lease.ttl));
            match layout.shared_keys(&lease.key) {
                None => invocation.key(layout.lock_key(&lease.key)).arg("m"),
                Some(shared) => invocation.key(shared.entries).key(shared.expiries).arg("s"),
            };
        }
        let renewed: Vec<i64> = node.invoke(&invocation, "renew").await?;
        if renewed.len() != chunk.len() {
            return Err(unexpected_reply("renew", node.node().shown()));
        }
        Ok(renewed)
    });
    let replies = try_join_all(calls).await?;
    Ok(replies
        .into_iter()
        .flatten()
        .map(|renewed| Ownership::held_if(renewed == 1))
        .collect())
}

/// Deletes the entry under `lock_key` on `node` if it is `lease_id`'s, and then announces
/// the release on `channel`; [`Ownership::NotHeld`] when the entry was not that lease's
/// (nothing is touched then).
pub(crate) async fn release_if_owner(
    node: &Node,
    lock_key: &str,
    lease_id: LeaseId,
    channel: &str,
) -> Result<Ownership> {
    let released: i64 = node
        .invoke(
            RELEASE.key(lock_key).arg(lease_id.to_string()).arg(channel),
            "release",
        )
        .await?;
    Ok(Ownership::held_if(released == 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_as_the_scripts_write_them() {
        let lease = LeaseId::from_u128(0xabc);
        let written = format!("{lease}:42:7");
        let held = parse_holder((written, 1500)).expect("well formed");
        assert_eq!(
            held,
            Some(Held {
                entry: Entry {
                    lease_id: lease,
                    token: 42
                },
                remaining_ttl: Duration::from_millis(1500),
                label: None,
            })
        );
        let labelled = format!("{lease}:42:7:{}", label_arg(Some("host:1 ü")));
        let held = parse_holder((labelled, 1500))
            .flatten()
            .expect("well formed");
        assert_eq!(held.entry.token, 42);
        assert_eq!(held.label.as_deref(), Some("host:1 ü"));
        assert_eq!(label_arg(None), "");
        assert_eq!(parse_holder((String::new(), -2)), Some(None));
        assert_eq!(
            parse_holder((format!("{lease}:7:0"), 0))
                .flatten()
                .map(|held| held.remaining_ttl),
            Some(Duration::ZERO),
            "under a millisecond left is still held"
        );
        assert_eq!(parse_holder(("garbage".into(), 10)), None);
    }
}
