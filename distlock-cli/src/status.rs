//! `distlock status`: who holds keys, never with the holder's lease id; with `--watch`,
//! again and again, with what changed between looks.

use std::io::Write;
use std::time::{Duration, Instant};

use distlock::{FencingToken, HoldKind, LockClient, LockStatus, Primitive};
use serde_json::json;

use crate::cli::{PrimitiveArg, StatusArgs};
use crate::duration::format_duration;
use crate::failure::{Failure, NOT_ACQUIRED};
use crate::store;

/// Looks the keys up and prints them; 0 when every key is held, 1 when one is free.
pub async fn status(args: StatusArgs, store_url: &str) -> Result<u8, Failure> {
    let client = store::connect(store_url).await?;
    if args.watch {
        return watch(&client, &args, store_url).await;
    }
    if args.kind != PrimitiveArg::Mutex {
        return holders(&client, &args, store_url).await;
    }
    let mut found = Vec::with_capacity(args.keys.len());
    for key in &args.keys {
        let status = client
            .inspect(key)
            .await
            .map_err(|err| Failure::from_store_error(&err, store_url))?;
        found.push((key.as_str(), status));
    }
    if args.json {
        let objects: Vec<_> = found
            .iter()
            .map(|(key, status)| as_json(key, status.as_ref()))
            .collect();
        println!("{}", serde_json::Value::Array(objects));
    } else {
        for (key, status) in &found {
            println!("{}", as_line(key, status.as_ref()));
        }
    }
    let all_held = found.iter().all(|(_, status)| status.is_some());
    Ok(if all_held { 0 } else { NOT_ACQUIRED })
}

/// Every holder of each key's semaphore or reader-writer lock, one line per holder (or
/// one JSON array per key); 0 when every key has a holder, 1 otherwise.
async fn holders(client: &LockClient, args: &StatusArgs, store_url: &str) -> Result<u8, Failure> {
    let primitive = Primitive::from(args.kind);
    let mut all_held = true;
    let mut objects = Vec::new();
    for key in &args.keys {
        let holders = client
            .holders(key, primitive)
            .await
            .map_err(|err| Failure::from_store_error(&err, store_url))?;
        all_held &= !holders.is_empty();
        if args.json {
            let holders: Vec<_> = holders.iter().map(holder_json).collect();
            objects.push(json!({
                "key": key,
                "kind": primitive.name(),
                "held": !holders.is_empty(),
                "holders": holders,
            }));
            continue;
        }
        if holders.is_empty() {
            println!("{key} ({}): free", primitive.name());
        }
        for status in &holders {
            println!(
                "{}",
                as_line(&format!("{key} ({})", primitive.name()), Some(status))
            );
        }
    }
    if args.json {
        println!("{}", serde_json::Value::Array(objects));
    }
    Ok(if all_held { 0 } else { NOT_ACQUIRED })
}

/// How a holder holds a key, for the line: nothing for a lock; `read`, `write` or
/// `permit of N`.
fn hold_name(kind: HoldKind) -> Option<String> {
    match kind {
        HoldKind::Mutex => None,
        HoldKind::Permit { limit } => Some(format!("permit of {limit}")),
        other => Some(other.name().to_string()),
    }
}

/// `KEY: held, token N, expires in 27.1s, 2 waiting, holder "..."` or `KEY: free`; a
/// semaphore's or reader-writer lock's holder says how it holds the key (`held (read)`).
pub fn as_line(key: &str, status: Option<&LockStatus>) -> String {
    let Some(status) = status else {
        return format!("{key}: free");
    };
    let mut line = format!(
        "{key}: held{}, token {}, expires in {}",
        hold_name(status.kind)
            .map(|kind| format!(" ({kind})"))
            .unwrap_or_default(),
        status.token,
        format_duration(status.remaining_ttl)
    );
    if let Some(waiters) = status.waiters {
        line.push_str(&format!(", {waiters} waiting"));
    }
    if let Some(holder) = &status.holder {
        line.push_str(&format!(", holder {holder:?}"));
    }
    line
}

/// One holder's object in `status --kind semaphore|rwlock --json`.
fn holder_json(status: &LockStatus) -> serde_json::Value {
    json!({
        "hold": status.kind.name(),
        "limit": match status.kind {
            HoldKind::Permit { limit } => Some(limit),
            _ => None,
        },
        "token": status.token.get(),
        "remaining_ttl_ms": u64::try_from(status.remaining_ttl.as_millis()).unwrap_or(u64::MAX),
        "waiters": status.waiters,
        "holder": status.holder,
    })
}

/// One key's object; `waiters` and `holder` are null where the store does not know them.
pub fn as_json(key: &str, status: Option<&LockStatus>) -> serde_json::Value {
    match status {
        None => json!({ "key": key, "held": false }),
        Some(status) => json!({
            "key": key,
            "held": true,
            "token": status.token.get(),
            "remaining_ttl_ms": u64::try_from(status.remaining_ttl.as_millis()).unwrap_or(u64::MAX),
            "waiters": status.waiters,
            "holder": status.holder,
        }),
    }
}

/// What a watch has seen of one key so far.
#[derive(Debug, Default)]
struct Seen {
    /// The holder's token at the last look, when the key was held.
    token: Option<FencingToken>,
    /// When the current holder was first seen holding the key.
    since: Option<Instant>,
    /// When the lease was to expire, as of the last look.
    expires: Option<Instant>,
    /// Expiries moved later while the token stayed: renewals.
    renewals: u64,
    /// Changes of holder: the key went from one token to another, or was taken while
    /// free (not counting the holder of the first look).
    handovers: u64,
    /// A look was taken before this one.
    looked: bool,
}

impl Seen {
    /// Takes in one look sent at `now`; `jitter` is how far the store's view of an expiry
    /// may move between looks without a renewal (its TTL granularity and the look's
    /// latency; at least 0.1 s, so renewals of leases under 0.3 s go unseen).
    fn look(&mut self, status: Option<&LockStatus>, now: Instant, jitter: Duration) {
        let first = !std::mem::replace(&mut self.looked, true);
        let Some(status) = status else {
            (self.token, self.since, self.expires) = (None, None, None);
            return;
        };
        let expires = now + status.remaining_ttl;
        if self.token == Some(status.token) {
            if self.expires.is_some_and(|before| expires > before + jitter) {
                self.renewals += 1;
            }
        } else {
            self.handovers += u64::from(!first);
            self.since = Some(now);
        }
        self.token = Some(status.token);
        self.expires = Some(expires);
    }
}

/// `status --watch`: one line (or JSON object) per key and look, until interrupted or
/// `--count` looks. A store that does not answer a look is reported and looked at again.
async fn watch(client: &LockClient, args: &StatusArgs, store_url: &str) -> Result<u8, Failure> {
    let jitter = client
        .capabilities()
        .ttl_granularity
        .max(Duration::from_millis(100));
    let mut seen: Vec<Seen> = args.keys.iter().map(|_| Seen::default()).collect();
    let mut ticks = tokio::time::interval(args.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looks = 0u64;
    loop {
        ticks.tick().await;
        for (key, seen) in args.keys.iter().zip(&mut seen) {
            // The send time: an expiry counted from it never runs ahead of the store's.
            let now = Instant::now();
            let line = match client.inspect(key).await {
                Ok(status) => {
                    seen.look(status.as_ref(), now, jitter);
                    if args.json {
                        watched_json(key, status.as_ref(), seen, now).to_string()
                    } else {
                        watched_line(key, status.as_ref(), seen, now)
                    }
                }
                Err(err) => {
                    let failure = Failure::from_store_error(&err, store_url);
                    if args.json {
                        json!({ "key": key, "error": failure.to_string() }).to_string()
                    } else {
                        format!("{key}: no answer: {failure}")
                    }
                }
            };
            println!("{line}");
        }
        // Piped to a program that reads as it goes: each look is there at once.
        let _ = std::io::stdout().flush();
        looks += 1;
        if args.count.is_some_and(|count| looks >= count) {
            return Ok(0);
        }
    }
}

/// [`as_line`] plus what the watch saw: `, held 3.2s, 4 renewals, 1 handover seen`.
fn watched_line(key: &str, status: Option<&LockStatus>, seen: &Seen, now: Instant) -> String {
    let mut line = as_line(key, status);
    if let Some(since) = seen.since.filter(|_| status.is_some()) {
        line.push_str(&format!(", held {}", format_duration(now - since)));
    }
    line.push_str(&format!(
        ", {} renewal{}, {} handover{} seen",
        seen.renewals,
        if seen.renewals == 1 { "" } else { "s" },
        seen.handovers,
        if seen.handovers == 1 { "" } else { "s" },
    ));
    line
}

/// [`as_json`] plus `held_for_ms` (null when free), `renewals_seen` and `handovers_seen`.
fn watched_json(
    key: &str,
    status: Option<&LockStatus>,
    seen: &Seen,
    now: Instant,
) -> serde_json::Value {
    let mut object = as_json(key, status);
    let held_for = seen
        .since
        .filter(|_| status.is_some())
        .map(|since| u64::try_from((now - since).as_millis()).unwrap_or(u64::MAX));
    object["held_for_ms"] = json!(held_for);
    object["renewals_seen"] = json!(seen.renewals);
    object["handovers_seen"] = json!(seen.handovers);
    object
}
