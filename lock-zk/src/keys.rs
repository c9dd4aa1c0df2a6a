//! Where a key's nodes live, and how lock nodes are named and ordered.
//!
//! Every key has one parent node (a container, which the server deletes once its last
//! child is gone); each acquisition creates one ephemeral-sequential child in it, named
//! `_c_<lease id as a UUID>-lock-<sequence>`: Curator's protected `InterProcessMutex`
//! layout, so the name tells who created the node (a retry finds its own node again) and
//! the suffix orders the queue.

use lock_core::{Error, ErrorKind, LeaseId, LockKey, Result};

use crate::config::Layout;

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

/// The name prefix of `lease`'s node (the server appends the sequence).
pub(crate) fn node_prefix(lease: LeaseId) -> String {
    let hex = lease.to_string();
    format!(
        "_c_{}-{}-{}-{}-{}-lock-",
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
    pub(crate) sequence: u64,
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
/// or another client's recipe's), ordered by sequence: the first holds the lock.
pub(crate) fn contenders(children: Vec<String>) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children
        .into_iter()
        .filter_map(|name| {
            let digits = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
            let suffix = &name[digits..];
            (suffix.len() >= 10)
                .then(|| suffix.parse().ok())
                .flatten()
                .map(|sequence| Contender { name, sequence })
        })
        .collect();
    queue.sort_by_key(|c| c.sequence);
    queue
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
}
