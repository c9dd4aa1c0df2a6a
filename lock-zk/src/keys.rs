//! Where a key's nodes live, and how lock nodes are named and ordered.
//!
//! Every key has one parent node (a container, which the server deletes once its last
//! child is gone); each acquisition creates one ephemeral-sequential child in it, named
//! `_c_<lease id as a UUID>-lock-<sequence>`: Curator's protected `InterProcessMutex`
//! layout, so the name tells who created the node (a retry finds its own node again) and
//! the suffix orders the queue.

use lock_core::{Error, ErrorKind, LeaseId, LockKey, Result};

/// Where the lock nodes of each key live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Each key, escaped into one node name, is a container node under
    /// [`ZkConfig::root`](crate::ZkConfig::root): any key is allowed.
    Distlock,
    /// The key *is* the lock path (relative to the chroot, without a leading `/`), as a
    /// JVM service using Curator's `InterProcessMutex` on the same path names it; keys that
    /// are not valid ZooKeeper paths are refused with `InvalidInput`.
    Curator,
}

/// Characters kept as they are in an escaped key; everything else is `%XX` per UTF-8 byte.
fn kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b':' | b'~')
}

/// The node name of `key` in the distlock layout: reversible (so one key, one name, and
/// no two keys share one) and always a valid name: no `/`, never `.` or `..`, and none of the code points ZooKeeper refuses (controls, surrogates, private use,
/// U+FFF0.., and anything outside the Basic Multilingual Plane, which Java would send as a
/// surrogate pair). `zookeeper` is reserved only directly under `/`, where no lock parent
/// is (the root has at least one segment).
pub(crate) fn encode_key(key: &str) -> String {
    let mut name = String::with_capacity(key.len());
    for byte in key.bytes() {
        if kept(byte) {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}

/// The key whose [`encode_key`] is `name`, if it is one.
pub(crate) fn decode_key(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else if kept(first) {
            bytes.push(first);
            rest = tail;
        } else {
            return None;
        }
    }
    String::from_utf8(bytes).ok()
}

/// Why `path` is not an absolute ZooKeeper path, if it is not one.
pub(crate) fn check_path(path: &str) -> std::result::Result<(), String> {
    let Some(relative) = path.strip_prefix('/') else {
        return Err("it does not start with '/'".into());
    };
    for segment in relative.split('/') {
        check_name(segment)?;
    }
    Ok(())
}

fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("it has an empty segment (or ends with '/')".into());
    }
    if name == "." || name == ".." {
        return Err(format!("segment {name:?} is reserved"));
    }
    if let Some(bad) = name.chars().find(|&c| {
        matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..)
    }) {
        return Err(format!("ZooKeeper refuses the character {bad:?}"));
    }
    Ok(())
}

/// The parent node of `key`'s lock nodes.
pub(crate) fn lock_parent(layout: Layout, root: &str, key: &LockKey) -> Result<String> {
    match layout {
        Layout::Distlock => Ok(format!("{root}/{}", encode_key(key.as_str()))),
        Layout::Curator => {
            let path = format!("/{}", key.as_str());
            check_path(&path).map_err(|why| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "{:?} is not a ZooKeeper path for the curator layout: {why}",
                        key.as_str()
                    ),
                )
            })?;
            if path == "/zookeeper" || path.starts_with("/zookeeper/") {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "/zookeeper is reserved by the server",
                ));
            }
            let records = records_dir(root);
            if path == records || path.starts_with(&format!("{records}/")) {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("{records} is reserved for idempotency records"),
                ));
            }
            Ok(path)
        }
    }
}

/// The directory of idempotency records: `<root>/.records`. In the distlock layout no key's
/// parent is named `.records` (an escaped key never holds a `.`); in the curator layout
/// [`lock_parent`] refuses lock paths at or under it.
pub(crate) fn records_dir(root: &str) -> String {
    format!("{root}/.records")
}

/// The record node of `key` (in either layout): its escaped name in [`records_dir`].
pub(crate) fn record_path(root: &str, key: &LockKey) -> String {
    format!("{}/{}", records_dir(root), encode_key(key.as_str()))
}

/// The name prefix of `lease`'s mutex node (the server appends the sequence).
pub(crate) fn node_prefix(lease: LeaseId) -> String {
    format!("{}lock-", protected(lease))
}

/// Curator's protected-mode start of a node name, `_c_<lease id as a UUID>-`: what tells
/// a node's creator, whatever the recipe's name that follows.
pub(crate) fn protected(lease: LeaseId) -> String {
    let hex = lease.to_string();
    format!(
        "_c_{}-{}-{}-{}-{}-",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// One child of a lock parent: a contender in the key's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Contender {
    pub(crate) name: String,
    /// The server's sequence number: the parent's child version (`cversion`) when the node
    /// was created, a signed 32-bit counter that wraps.
    pub(crate) sequence: i32,
}

impl Contender {
    /// The lease id the node was created for: ours (`_c_<uuid>-lock-`), or kazoo's
    /// (`<32 hex digits>__lock__`); `None` for a name we cannot attribute.
    pub(crate) fn lease_id(&self) -> Option<LeaseId> {
        let hex: String = if let Some(rest) = self.name.strip_prefix("_c_") {
            rest.get(..36)?.chars().filter(|&c| c != '-').collect()
        } else {
            self.name.get(..32)?.to_string()
        };
        hex.parse().ok()
    }
}

/// The children of a lock parent that take part in the queue (every sequential node, ours
/// or another client's recipe's), in creation order: the first holds the lock.
///
/// The sequence is the parent's `cversion`, a signed 32-bit counter that grows by one per
/// child created *or* deleted and wraps from 2³¹−1 to −2³¹, formatted as `%010d`: ten
/// digits, or a minus sign and nine or ten digits once it is negative. The live nodes of a
/// parent span far less than half the counter's range, so they are ordered by their
/// distance from the oldest one, modulo 2³², which is creation order across the wraps
/// too: the oldest is the one after the largest gap between neighbouring sequences.
pub(crate) fn contenders(children: Vec<String>) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children
        .into_iter()
        .filter_map(|name| sequence_of(&name).map(|sequence| Contender { name, sequence }))
        .collect();
    // `as u32` reinterprets the two's-complement bits: the counter's order modulo 2^32.
    let bits = |c: &Contender| c.sequence as u32;
    queue.sort_by_key(|c| (bits(c), c.name.clone()));
    let oldest = (0..queue.len())
        .max_by_key(|&at| {
            let before = if at == 0 { queue.len() - 1 } else { at - 1 };
            bits(&queue[at]).wrapping_sub(bits(&queue[before]))
        })
        .unwrap_or(0);
    queue.rotate_left(oldest);
    queue
}

/// The sequence the server appended to `name` (`%010d` of a signed 32-bit counter), if the
/// name ends in one: `0000000042`, `-000000042` or `-2147483648`. A minus sign before the
/// digits is the number's when it follows the recipe's separator (`-lock--…`,
/// `__lock__-…`), the separator itself otherwise (`-lock-…`).
fn sequence_of(name: &str) -> Option<i32> {
    let bytes = name.as_bytes();
    let digits = bytes
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits < 9 {
        return None;
    }
    let run = &name[name.len() - digits.min(10)..];
    let value: i64 = run.parse().ok()?;
    let before = |back: usize| {
        name.len()
            .checked_sub(digits.min(10) + back)
            .map(|at| bytes[at])
    };
    let signed = digits <= 10 && before(1) == Some(b'-') && matches!(before(2), Some(b'-' | b'_'));
    match (signed, digits) {
        (true, _) => i32::try_from(-value).ok(),
        (false, 9) => None,
        (false, _) => i32::try_from(value).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_its_own_valid_name() {
        let keys = [
            "a",
            "/",
            ".",
            "..",
            "zookeeper",
            "a/b",
            "a%2Fb",
            "%",
            "日本語",
            "\u{e000}",
            "😀",
            "\u{fff0}",
            " ",
            "a.b",
            "A",
            "~x:y-z_",
        ];
        let long = "é".repeat(128);
        let mut names = std::collections::HashSet::new();
        for key in keys.iter().copied().chain([long.as_str()]) {
            let name = encode_key(key);
            check_name(&name).unwrap();
            assert!(name != "." && name != "..");
            assert_eq!(decode_key(&name).as_deref(), Some(key));
            assert!(
                !name.contains('.'),
                "{key:?} could be the records directory"
            );
            assert!(names.insert(name), "{key:?} shares a name");
        }
    }

    #[test]
    fn curator_layout_needs_a_real_path() {
        let parent = |key: &str| lock_parent(Layout::Curator, "/r", &LockKey::new(key).unwrap());
        assert_eq!(parent("locks/a").unwrap(), "/locks/a");
        assert_eq!(parent("r/records").unwrap(), "/r/records");
        for bad in [
            "a//b",
            "a/",
            "./a",
            "zookeeper/x",
            "\u{e000}",
            "r/.records",
            "r/.records/k",
        ] {
            assert_eq!(
                parent(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{bad}"
            );
        }
    }

    #[test]
    fn contenders_are_ordered_by_sequence_and_attributed() {
        let lease = LeaseId::random();
        let ours = format!("{}0000000012", node_prefix(lease));
        let kazoo = format!("{}__lock__0000000003", "ab".repeat(16));
        let queue = contenders(vec![ours.clone(), "stray".into(), kazoo.clone()]);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue[0].name, kazoo);
        assert_eq!(queue[1].lease_id(), Some(lease));
        assert_eq!(queue[1].sequence, 12);
    }

    fn names(queue: &[Contender]) -> Vec<&str> {
        queue.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn sequences_are_read_as_the_server_formats_them() {
        for (name, sequence) in [
            ("_c_a-lock-0000000005", Some(5)),
            ("_c_a-lock-2147483647", Some(i32::MAX)),
            ("_c_a-lock-1500000000", Some(1_500_000_000)),
            ("lock-0000000007", Some(7)),
            ("_c_a-lock--2147483648", Some(i32::MIN)),
            ("_c_a-lock--1500000000", Some(-1_500_000_000)),
            ("_c_a-lock--000000001", Some(-1)),
            ("_c_a-lock--999999999", Some(-999_999_999)),
            ("abab__lock__0000000003", Some(3)),
            ("abab__lock__-000000003", Some(-3)),
            ("abab__lock__-2147483648", Some(i32::MIN)),
            ("_c_a-lock-000000001", None),
            ("_c_a-lock-2147483648", None),
            ("stray", None),
        ] {
            assert_eq!(sequence_of(name), sequence, "{name}");
        }
    }

    #[test]
    fn the_queue_keeps_creation_order_across_the_wrap() {
        // The counter passes 2^31 - 1 and goes on at -2^31.
        let queue = contenders(vec![
            "_c_d-lock--2147483646".into(),
            "_c_c-lock--2147483648".into(),
            "_c_b-lock-2147483647".into(),
            "_c_a-lock-2147483646".into(),
        ]);
        assert_eq!(
            names(&queue),
            [
                "_c_a-lock-2147483646",
                "_c_b-lock-2147483647",
                "_c_c-lock--2147483648",
                "_c_d-lock--2147483646"
            ]
        );
        // It passes -1 and goes on at 0; nine-digit negatives are contenders too.
        let queue = contenders(vec![
            "_c_d-lock-0000000000".into(),
            "_c_a-lock--000000003".into(),
            "_c_e-lock-0000000005".into(),
            "_c_b-lock--000000001".into(),
            format!("{}__lock__-000000002", "ab".repeat(16)),
        ]);
        assert_eq!(
            names(&queue),
            [
                "_c_a-lock--000000003",
                &format!("{}__lock__-000000002", "ab".repeat(16)),
                "_c_b-lock--000000001",
                "_c_d-lock-0000000000",
                "_c_e-lock-0000000005"
            ]
        );
        // Sequences more than 2^31 apart (a node that outlived 2^31 changes of its parent)
        // cannot be ordered by sequence, but none of them is dropped.
        let queue = contenders(vec![
            "_c_a-lock-0000000005".into(),
            "_c_b-lock--2147483648".into(),
            "_c_c-lock--000000001".into(),
            "_c_d-lock-0000000000".into(),
        ]);
        assert_eq!(queue.len(), 4);
        // Before any wrap the order is the numeric one, as Curator's and kazoo's.
        let queue = contenders(vec![
            "_c_b-lock-0000000010".into(),
            "_c_a-lock-0000000002".into(),
            "_c_c-lock-2147483647".into(),
        ]);
        assert_eq!(
            names(&queue),
            [
                "_c_a-lock-0000000002",
                "_c_b-lock-0000000010",
                "_c_c-lock-2147483647"
            ]
        );
    }
}
