//! Where a lock lives in Redis: key names, hash tags and the release channel.
//!
//! A user key may contain anything, including `{`, `}`, glob and Lua metacharacters, so it
//! is never written into a Redis key as is: its UTF-8 bytes are hex-encoded. The hex form is
//! the whole hash tag, so the lock key and its fencing counter always share one slot, no
//! user key can choose another key's tag, and `SCAN MATCH` patterns built from it need no
//! escaping. The configured prefix may not contain braces or glob characters (checked in
//! the config).

use std::fmt::Write as _;

use lock_core::LockKey;

/// The key layout under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
}

const FENCE_SUFFIX: &str = ":fence";
const RECORD_SUFFIX: &str = ":record";

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
}
