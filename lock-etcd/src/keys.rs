//! Where a lock's entries live in etcd, and what they hold.
//!
//! Every waiter and holder of a key has one entry in the key's *directory*; the owner is
//! the entry with the lowest create revision (see the crate docs).

use lock_core::{LeaseId, LockKey};

use crate::config::Layout;

/// The names of one client's keys.
#[derive(Clone, Debug)]
pub(crate) struct KeySpace {
    prefix: String,
    layout: Layout,
}

impl KeySpace {
    pub(crate) fn new(prefix: &str, layout: Layout) -> Self {
        KeySpace {
            prefix: prefix.trim_end_matches('/').to_string(),
            layout,
        }
    }

    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Refuses a key the layout cannot keep apart from others: in the etcd-mutex layout
    /// the range of `a` covers `a/b`, so keys with `/` are refused there.
    pub(crate) fn check(&self, key: &LockKey) -> lock_core::Result<()> {
        if self.layout == Layout::EtcdMutex && key.as_str().contains('/') {
            return Err(lock_core::Error::new(
                lock_core::ErrorKind::InvalidInput,
                format!(
                    "{:?}: the etcd-mutex layout cannot keep a key with '/' apart from \
                     the keys it names",
                    key.as_str()
                ),
            ));
        }
        Ok(())
    }

    /// The directory holding every entry of `key`, ending in `/`.
    ///
    /// In the distlock layout the user key is hex-encoded: hex has no `/`, so the
    /// directory of one key is never a prefix of another's (`a` is `61/`, `a/b` is
    /// `612f62/`, `ab` is `6162/`), and no key can name, scan or delete another's entries.
    pub(crate) fn dir(&self, key: &LockKey) -> Vec<u8> {
        let mut dir = self.prefix.as_bytes().to_vec();
        dir.push(b'/');
        match self.layout {
            Layout::Distlock => {
                for byte in key.as_str().bytes() {
                    dir.extend_from_slice(format!("{byte:02x}").as_bytes());
                }
            }
            Layout::EtcdMutex => dir.extend_from_slice(key.as_str().as_bytes()),
        }
        dir.push(b'/');
        dir
    }

    /// The entry of acquisition `lease_id` under the etcd lease `etcd_lease`.
    pub(crate) fn entry(&self, key: &LockKey, lease_id: LeaseId, etcd_lease: i64) -> Vec<u8> {
        let mut entry = self.dir(key);
        match self.layout {
            Layout::Distlock => entry.extend_from_slice(lease_id.to_string().as_bytes()),
            // What etcd's concurrency.Mutex writes: the session's lease id in hex.
            Layout::EtcdMutex => entry.extend_from_slice(format!("{etcd_lease:x}").as_bytes()),
        }
        entry
    }

    /// Where a lease's entry is when the name says it (the distlock layout); in the
    /// etcd-mutex layout the name depends on the etcd lease and must be searched for.
    pub(crate) fn known_entry(&self, key: &LockKey, lease_id: LeaseId) -> Option<Vec<u8>> {
        match self.layout {
            Layout::Distlock => Some(self.entry(key, lease_id, 0)),
            Layout::EtcdMutex => None,
        }
    }

    /// Where `key`'s idempotency record lives: `<prefix>#records/<hex of the key>`, beside
    /// the lock directories but outside every one of them and outside the root they are
    /// listed from, in both layouts.
    pub(crate) fn record(&self, key: &LockKey) -> Vec<u8> {
        let mut record = self.prefix.as_bytes().to_vec();
        record.extend_from_slice(b"#records/");
        for byte in key.as_str().bytes() {
            record.extend_from_slice(format!("{byte:02x}").as_bytes());
        }
        record
    }

    /// The tombstone of acquisition `lease_id` on the etcd lease `etcd_lease`: while it
    /// exists no entry of that acquisition is written with that lease (see `retired.rs`).
    /// Beside the lock directories, outside the root they are listed from, in both layouts.
    pub(crate) fn tombstone(&self, etcd_lease: i64, lease_id: LeaseId) -> Vec<u8> {
        let mut tombstone = self.prefix.as_bytes().to_vec();
        tombstone.extend_from_slice(format!("#retired/{etcd_lease:x}/{lease_id}").as_bytes());
        tombstone
    }

    /// Everything this client may have written, for a look at what is left.
    pub(crate) fn root(&self) -> Vec<u8> {
        let mut root = self.prefix.as_bytes().to_vec();
        root.push(b'/');
        root
    }

    /// The user key a directory belongs to (for residue listings).
    pub(crate) fn user_key(&self, etcd_key: &[u8]) -> Option<String> {
        let rest = etcd_key.strip_prefix(self.root().as_slice())?;
        let end = rest.iter().rposition(|b| *b == b'/')?;
        self.decode(&rest[..end])
    }

    /// Where the directories of every user key starting with `key_prefix` begin: every
    /// such directory, and no other key's, starts with it (in the distlock layout; in the
    /// etcd-mutex layout the range may also hold other keys, to be filtered by name).
    pub(crate) fn dirs_starting_with(&self, key_prefix: &str) -> Vec<u8> {
        let mut start = self.root();
        match self.layout {
            Layout::Distlock => {
                for byte in key_prefix.bytes() {
                    start.extend_from_slice(format!("{byte:02x}").as_bytes());
                }
            }
            Layout::EtcdMutex => start.extend_from_slice(key_prefix.as_bytes()),
        }
        start
    }

    /// The directory an etcd key lies in (the root, the name, `/`) and the user key it
    /// belongs to: the range `inspect` reads for that user key holds it. `None` for a key
    /// outside the root, or whose name is not a user key of this layout.
    pub(crate) fn dir_of<'k>(&self, etcd_key: &'k [u8]) -> Option<(&'k [u8], String)> {
        let root = self.root();
        let rest = etcd_key.strip_prefix(root.as_slice())?;
        // The first `/`: hex names have none, and etcd's mutex on `name` scans `name/`
        // as a prefix, so deeper keys count as entries of the first name.
        let end = rest.iter().position(|b| *b == b'/')?;
        let key = self.decode(&rest[..end])?;
        Some((&etcd_key[..root.len() + end + 1], key))
    }

    /// The user key a directory name stands for.
    fn decode(&self, name: &[u8]) -> Option<String> {
        match self.layout {
            Layout::Distlock => {
                // Only what `dir` writes: another spelling would name a directory that
                // `inspect` of the decoded key never reads.
                if !name.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return None;
                }
                let hex = std::str::from_utf8(name).ok()?;
                let bytes: Option<Vec<u8>> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect();
                String::from_utf8(bytes?).ok()
            }
            Layout::EtcdMutex => String::from_utf8(name.to_vec()).ok(),
        }
    }
}

/// The end of the range of every key that starts with `prefix` (etcd's `WithPrefix`).
pub(crate) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An entry's value: the acquisition's lease id, then the holder's label if any.
pub(crate) fn value(lease_id: LeaseId, label: Option<&str>) -> String {
    match label {
        Some(label) => format!("{lease_id}\n{label}"),
        None => lease_id.to_string(),
    }
}

/// The lease id and label an entry's value holds; `None` for an entry that is not
/// distlock's (an `etcdctl lock` or Go mutex entry, whose value is empty).
pub(crate) fn parse_value(value: &[u8]) -> Option<(LeaseId, Option<String>)> {
    let text = std::str::from_utf8(value).ok()?;
    let (id, label) = match text.split_once('\n') {
        Some((id, label)) => (id, Some(label.to_string())),
        None => (text, None),
    };
    Some((id.parse().ok()?, label))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(key: &str) -> Vec<u8> {
        KeySpace::new("p", Layout::Distlock).dir(&LockKey::new(key).unwrap())
    }

    /// No key's directory is a prefix of another's, so no range scan of one key sees
    /// another's entries.
    #[test]
    fn directories_never_overlap() {
        let keys = [
            "a", "a/b", "ab", "a\u{0}", "a0", "", "a/", "61", "6", "a\u{ff}",
        ];
        for (i, one) in keys.iter().enumerate() {
            for (j, other) in keys.iter().enumerate() {
                if i != j && LockKey::new(one).is_ok() && LockKey::new(other).is_ok() {
                    let (one, other) = (dir(one), dir(other));
                    assert!(!other.starts_with(&one), "{one:?} covers {other:?}");
                }
            }
        }
    }

    /// `list_held` stops its scan at the limit because directories sort as their keys do.
    #[test]
    fn directories_sort_as_their_keys() {
        let mut keys = vec![
            "a", "a/b", "ab", "a!", "a0", " ", "a/", "b", "a\u{ff}", "a b",
        ];
        keys.sort_unstable();
        let dirs: Vec<Vec<u8>> = keys.iter().map(|key| dir(key)).collect();
        let mut sorted = dirs.clone();
        sorted.sort();
        assert_eq!(dirs, sorted);
    }

    #[test]
    fn entries_name_their_directory_and_key() {
        let space = KeySpace::new("p", Layout::Distlock);
        let key = LockKey::new("a/b").unwrap();
        let entry = space.entry(&key, LeaseId::random(), 7);
        let (dir, name) = space.dir_of(&entry).unwrap();
        assert_eq!((dir, name.as_str()), (space.dir(&key).as_slice(), "a/b"));
        // Spellings `dir` never writes are not taken for a key.
        assert_eq!(space.dir_of(b"p/6A/x"), None);
        assert_eq!(space.dir_of(b"p/+1/x"), None);
        assert_eq!(space.dir_of(b"p/61"), None);
        let mutex = KeySpace::new("p", Layout::EtcdMutex);
        let (dir, name) = mutex.dir_of(b"p/job/sub/694d").unwrap();
        assert_eq!((dir, name.as_str()), (&b"p/job/"[..], "job"));
    }

    #[test]
    fn user_keys_round_trip() {
        let space = KeySpace::new("p/", Layout::Distlock);
        let key = LockKey::new("a/b ü").unwrap();
        let entry = space.entry(&key, LeaseId::random(), 7);
        assert_eq!(space.user_key(&entry).as_deref(), Some("a/b ü"));
    }

    #[test]
    fn values_round_trip() {
        let id = LeaseId::random();
        assert_eq!(parse_value(value(id, None).as_bytes()), Some((id, None)));
        assert_eq!(
            parse_value(value(id, Some("host\n1")).as_bytes()),
            Some((id, Some("host\n1".to_string())))
        );
        assert_eq!(parse_value(b""), None);
        assert_eq!(range_end(b"a/"), b"a0");
        assert_eq!(range_end(b"a\xff"), b"b");
    }
}
