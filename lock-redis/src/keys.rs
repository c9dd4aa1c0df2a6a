//! Where a lock lives in Redis: key names, hash tags and the release channel.
//!
//! A user key may contain anything, including `{`, `}`, glob and Lua metacharacters, so it
//! is never written into a Redis key as is: its UTF-8 bytes are hex-encoded. The hex form is
//! the whole hash tag, so the lock key and its fencing counter always share one slot, no
//! user key can choose another key's tag, and `SCAN MATCH` patterns built from it need no
//! escaping. The configured prefix may not contain braces or glob characters (checked in
//! the config).
//!
//! A semaphore or reader-writer lock on a key lives under the same hash tag as the key's
//! mutex, behind a suffix naming its primitive (`:semaphore`, `:rwlock`), so the three
//! primitives of one name never share a Redis key, and everything of a shared key is in
//! one slot.

use std::fmt::Write as _;

use lock_core::{LockKey, Primitive};

/// The key layout under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
}

const FENCE_SUFFIX: &str = ":fence";
const RECORD_SUFFIX: &str = ":record";
const EXPIRIES_SUFFIX: &str = ":expiry";
const INTENTS_SUFFIX: &str = ":intents";

/// The Redis keys of one semaphore or reader-writer lock (see `scripts/shared.lua`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SharedKeys {
    /// `<lock key>:<primitive>`: a hash of lease id to entry; also the name its releases
    /// are announced under.
    pub(crate) entries: String,
    /// `<entries>:expiry`: a sorted set of lease id to expiry (server milliseconds).
    pub(crate) expiries: String,
    /// `<entries>:intents`: waiting writers' lease ids to their intents' expiry (only a
    /// reader-writer lock has any).
    pub(crate) intents: String,
    /// `<entries>:fence`: the primitive's fencing counter, kept for ever.
    pub(crate) fence: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.to_string(),
        }
    }

    /// `<prefix>{<hex of the key>}`: the lock entry.
    pub(crate) fn lock_key(&self, key: &LockKey) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 2 + key.as_str().len() * 2);
        out.push_str(&self.prefix);
        out.push('{');
        push_hex(&mut out, key.as_str());
        out.push('}');
        out
    }

    /// `<prefix>{<hex of the key>}:fence`: the key's fencing counter, kept for ever.
    pub(crate) fn fence_key(&self, key: &LockKey) -> String {
        let mut out = self.lock_key(key);
        out.push_str(FENCE_SUFFIX);
        out
    }

    /// `<prefix>{<hex of the key>}:record`: the key's idempotency record, kept for its
    /// retention.
    pub(crate) fn record_key(&self, key: &LockKey) -> String {
        let mut out = self.lock_key(key);
        out.push_str(RECORD_SUFFIX);
        out
    }

    /// Where the semaphore or reader-writer lock `key` lives; `None` for a mutex key.
    pub(crate) fn shared_keys(&self, key: &LockKey) -> Option<SharedKeys> {
        let primitive = match key.primitive() {
            Primitive::Mutex => return None,
            other => other.name(),
        };
        let entries = format!("{}:{primitive}", self.lock_key(key));
        Some(SharedKeys {
            expiries: format!("{entries}{EXPIRIES_SUFFIX}"),
            intents: format!("{entries}{INTENTS_SUFFIX}"),
            fence: format!("{entries}{FENCE_SUFFIX}"),
            entries,
        })
    }

    /// The name releases of `key` are announced under: its lock key for a mutex, its
    /// holders hash for a shared key.
    pub(crate) fn released_name(&self, key: &LockKey) -> String {
        match self.shared_keys(key) {
            Some(shared) => shared.entries,
            None => self.lock_key(key),
        }
    }

    /// Whether a release announced under `name` ([`released_name`](Self::released_name))
    /// may let several waiters in at once: a semaphore's or reader-writer lock's (a
    /// mutex's name is its lock key, which ends with its hash tag's `}`).
    pub(crate) fn releases_many(name: &str) -> bool {
        !name.ends_with('}')
    }

    /// The channel every release of this namespace is published on; the message is the
    /// released lock key.
    pub(crate) fn channel(&self) -> String {
        format!("{}released", self.prefix)
    }

    /// A `SCAN MATCH` pattern for the lock entries and counters of keys starting with
    /// `key_prefix`.
    pub(crate) fn scan_pattern(&self, key_prefix: &str) -> String {
        let mut out = String::new();
        out.push_str(&self.prefix);
        out.push('{');
        push_hex(&mut out, key_prefix);
        out.push('*');
        out
    }

    /// The user key of a lock entry found by [`scan_pattern`](Self::scan_pattern), or
    /// `None` for a fencing counter, a record or a foreign key.
    pub(crate) fn user_key(&self, redis_key: &str) -> Option<String> {
        let hex = redis_key
            .strip_prefix(&self.prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        text_of_hex(hex)
    }

    /// The user key of anything [`scan_pattern`](Self::scan_pattern) finds that is not
    /// kept for ever or for a retention: a mutex entry, and a semaphore's or reader-writer
    /// lock's holders, expiries and intents; `None` for counters, records and foreign keys.
    pub(crate) fn stored_user_key(&self, redis_key: &str) -> Option<String> {
        let (tag, suffix) = redis_key
            .strip_prefix(&self.prefix)?
            .strip_prefix('{')?
            .split_once('}')?;
        let shared = [Primitive::Semaphore, Primitive::RwLock]
            .into_iter()
            .any(|primitive| {
                suffix
                    .strip_prefix(':')
                    .and_then(|rest| rest.strip_prefix(primitive.name()))
                    .is_some_and(|rest| matches!(rest, "" | EXPIRIES_SUFFIX | INTENTS_SUFFIX))
            });
        if suffix.is_empty() || shared {
            text_of_hex(tag)
        } else {
            None
        }
    }
}

/// The UTF-8 text whose bytes `hex` spells (as [`push_hex`] writes them); `None` when it
/// does not decode.
pub(crate) fn text_of_hex(hex: &str) -> Option<String> {
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// Appends `text`'s UTF-8 bytes to `out` in lowercase hex.
pub(crate) fn push_hex(out: &mut String, text: &str) {
    for byte in text.bytes() {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_keys_keep_one_hash_tag() {
        let layout = Layout::new("app:");
        let key = LockKey::new("a}{b*?[x] é").unwrap();
        let lock = layout.lock_key(&key);
        let tag = &lock[lock.find('{').unwrap() + 1..lock.find('}').unwrap()];
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(layout.fence_key(&key), format!("{lock}:fence"));
        assert_eq!(layout.user_key(&lock).as_deref(), Some("a}{b*?[x] é"));
        assert_eq!(layout.user_key(&layout.fence_key(&key)), None);
        assert_eq!(layout.record_key(&key), format!("{lock}:record"));
        assert_eq!(layout.user_key(&layout.record_key(&key)), None);
        assert!(layout.scan_pattern("a}").starts_with("app:{617d"));
    }

    #[test]
    fn shared_keys_keep_the_tag_and_their_own_namespace() {
        let layout = Layout::new("app:");
        let mutex = LockKey::new("k").unwrap();
        assert_eq!(layout.shared_keys(&mutex), None);
        assert_eq!(layout.released_name(&mutex), "app:{6b}");
        let semaphore = mutex
            .held_as(lock_core::HoldKind::Permit { limit: 2 })
            .unwrap();
        let rwlock = mutex.held_as(lock_core::HoldKind::Write).unwrap();
        let keys = layout.shared_keys(&semaphore).unwrap();
        assert_eq!(keys.entries, "app:{6b}:semaphore");
        assert_eq!(keys.expiries, "app:{6b}:semaphore:expiry");
        assert_eq!(keys.intents, "app:{6b}:semaphore:intents");
        assert_eq!(keys.fence, "app:{6b}:semaphore:fence");
        assert_eq!(layout.released_name(&semaphore), keys.entries);
        assert!(Layout::releases_many(&layout.released_name(&semaphore)));
        assert!(!Layout::releases_many(&layout.released_name(&mutex)));
        let read = layout
            .shared_keys(&mutex.held_as(lock_core::HoldKind::Read).unwrap())
            .unwrap();
        assert_eq!(read, layout.shared_keys(&rwlock).unwrap());
        assert_eq!(read.entries, "app:{6b}:rwlock");
        for stored in [
            "app:{6b}",
            "app:{6b}:semaphore",
            "app:{6b}:semaphore:expiry",
            "app:{6b}:rwlock",
            "app:{6b}:rwlock:expiry",
            "app:{6b}:rwlock:intents",
        ] {
            assert_eq!(
                layout.stored_user_key(stored).as_deref(),
                Some("k"),
                "{stored}"
            );
        }
        for kept in [
            "app:{6b}:fence",
            "app:{6b}:record",
            "app:{6b}:semaphore:fence",
            "app:{6b}:rwlock:fence",
            "app:{6b}:rwlocks",
            "other:{6b}",
        ] {
            assert_eq!(layout.stored_user_key(kept), None, "{kept}");
        }
        // The mutex alone is what list_held reads.
        assert_eq!(layout.user_key("app:{6b}:rwlock"), None);
    }
}
