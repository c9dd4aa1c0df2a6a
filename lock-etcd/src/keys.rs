//! Where a lock's entries live in etcd, and what they hold.
//!
//! Every waiter and holder of a key has one entry in the key's *directory*; the owner is
//! the entry with the lowest create revision (see the crate docs). Semaphores and
//! reader-writer locks have directories of their own, outside the mutexes' root (see
//! `shared.rs`).

use std::collections::HashSet;

use etcd_client::KeyValue;
use lock_core::{HoldKind, LeaseId, LockKey, Primitive};

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
    /// the range of `a` covers `a/b`, so keys with `/` are refused there. That layout has
    /// no semaphores (etcd has none to lay one out as): `Unsupported`.
    pub(crate) fn check(&self, key: &LockKey) -> lock_core::Result<()> {
        if self.layout == Layout::EtcdMutex && key.primitive() == Primitive::Semaphore {
            return Err(lock_core::Error::new(
                lock_core::ErrorKind::Unsupported,
                "etcd: the etcd-mutex layout keeps etcd's mutex and the reader-writer lock of \
                 its Go recipes, and etcd has no semaphore to lay one out as; semaphores \
                 need layout=distlock",
            ));
        }
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
    ///
    /// A semaphore's or reader-writer lock's directory is under its primitive's root
    /// ([`primitive_root`](Self::primitive_root)), so the mutex, the semaphore and the
    /// reader-writer lock of one name never meet.
    pub(crate) fn dir(&self, key: &LockKey) -> Vec<u8> {
        let mut dir = self.primitive_root(key.primitive());
        self.push_name(&mut dir, key.as_str());
        dir.push(b'/');
        dir
    }

    /// The root a primitive's directories are under: `<prefix>/` for mutexes,
    /// `<prefix>#semaphore/` and `<prefix>#rwlock/` for the others. Only the first is
    /// [`root`](Self::root): listings of held mutexes never see the others.
    pub(crate) fn primitive_root(&self, primitive: Primitive) -> Vec<u8> {
        let mut root = self.prefix.as_bytes().to_vec();
        root.extend_from_slice(match primitive {
            Primitive::Mutex => b"/".as_slice(),
            Primitive::Semaphore => b"#semaphore/",
            Primitive::RwLock => b"#rwlock/",
        });
        root
    }

    /// Appends a user key's (or key prefix's) name as the layout spells it.
    fn push_name(&self, to: &mut Vec<u8>, name: &str) {
        match self.layout {
            Layout::Distlock => {
                for byte in name.bytes() {
                    to.extend_from_slice(format!("{byte:02x}").as_bytes());
                }
            }
            Layout::EtcdMutex => to.extend_from_slice(name.as_bytes()),
        }
    }

    /// The entry of acquisition `lease_id` under the etcd lease `etcd_lease`. A shared
    /// hold's entry is in its kind's part of the directory ([`kind_part`]).
    pub(crate) fn entry(&self, key: &LockKey, lease_id: LeaseId, etcd_lease: i64) -> Vec<u8> {
        let mut entry = self.dir(key);
        if let Some(part) = kind_part(key.kind()) {
            entry.extend_from_slice(&part);
            entry.extend_from_slice(lease_id.to_string().as_bytes());
            return entry;
        }
        match self.layout {
            Layout::Distlock => entry.extend_from_slice(lease_id.to_string().as_bytes()),
            // What etcd's concurrency.Mutex writes: the session's lease id in hex.
            Layout::EtcdMutex => entry.extend_from_slice(format!("{etcd_lease:x}").as_bytes()),
        }
        entry
    }

    /// Where a lease's entry is when the name says it (the distlock layout, and every
    /// shared hold); in the etcd-mutex layout a mutex entry's name depends on the etcd
    /// lease and must be searched for.
    pub(crate) fn known_entry(&self, key: &LockKey, lease_id: LeaseId) -> Option<Vec<u8>> {
        match self.layout {
            Layout::EtcdMutex if key.primitive() == Primitive::Mutex => None,
            _ => Some(self.entry(key, lease_id, 0)),
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

    /// The user key a mutex directory belongs to (for residue listings).
    pub(crate) fn user_key(&self, etcd_key: &[u8]) -> Option<String> {
        let rest = etcd_key.strip_prefix(self.root().as_slice())?;
        let end = rest.iter().rposition(|b| *b == b'/')?;
        self.decode(&rest[..end])
    }

    /// The user key an entry under `root` (a shared primitive's, or the grant markers')
    /// belongs to: its name is the first part after the root.
    pub(crate) fn user_key_under(&self, root: &[u8], etcd_key: &[u8]) -> Option<String> {
        let rest = etcd_key.strip_prefix(root)?;
        let end = rest.iter().position(|b| *b == b'/')?;
        self.decode(&rest[..end])
    }

    /// Where the grant markers of the etcd-mutex layout's reader-writer locks are:
    /// `<prefix>#granted/`, outside every lock's directory (etcd's Go `recipe.RWMutex`
    /// counts every key under its name as an entry).
    pub(crate) fn markers_root(&self) -> Vec<u8> {
        let mut root = self.prefix.as_bytes().to_vec();
        root.extend_from_slice(b"#granted/");
        root
    }

    /// The grant marker of `lease_id`'s hold of `key`, under
    /// [`markers_root`](Self::markers_root).
    pub(crate) fn marker(&self, key: &LockKey, lease_id: LeaseId) -> Vec<u8> {
        let mut marker = self.markers(key);
        marker.extend_from_slice(lease_id.to_string().as_bytes());
        marker
    }

    /// The directory of `key`'s grant markers.
    pub(crate) fn markers(&self, key: &LockKey) -> Vec<u8> {
        let mut dir = self.markers_root();
        self.push_name(&mut dir, key.as_str());
        dir.push(b'/');
        dir
    }

    /// Where the directories of every user key starting with `key_prefix` begin: every
    /// such directory, and no other key's, starts with it (in the distlock layout; in the
    /// etcd-mutex layout the range may also hold other keys, to be filtered by name).
    pub(crate) fn dirs_starting_with(&self, key_prefix: &str) -> Vec<u8> {
        self.starting_with(self.root(), key_prefix)
    }

    /// [`dirs_starting_with`](Self::dirs_starting_with) under another `root`.
    pub(crate) fn starting_with(&self, root: Vec<u8>, key_prefix: &str) -> Vec<u8> {
        let mut start = root;
        self.push_name(&mut start, key_prefix);
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

/// The part of a shared hold's directory its entries of `kind` are in, ending in `/`:
/// `read/` and `write/` for a reader-writer lock (the names etcd's Go `recipe.RWMutex`
/// uses), the limit in decimal for a semaphore's permits (`3/`), so that entries of another
/// limit are a range of their own; `None` for a mutex.
pub(crate) fn kind_part(kind: HoldKind) -> Option<Vec<u8>> {
    match kind {
        HoldKind::Mutex => None,
        HoldKind::Permit { limit } => Some(format!("{limit}/").into_bytes()),
        HoldKind::Read => Some(b"read/".to_vec()),
        HoldKind::Write => Some(b"write/".to_vec()),
    }
}

/// The kind of hold a shared entry is, from its name after its directory (`rest`):
/// the inverse of [`kind_part`].
pub(crate) fn kind_of(rest: &[u8]) -> Option<HoldKind> {
    let (part, _) = rest.split_at(rest.iter().position(|b| *b == b'/')?);
    match part {
        b"read" => Some(HoldKind::Read),
        b"write" => Some(HoldKind::Write),
        digits => {
            let limit: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
            (limit > 0).then_some(HoldKind::Permit { limit })
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

/// A shared hold's entry's value: its state line (`held` or `queued`), then [`value`].
pub(crate) fn shared_value(held: bool, lease_id: LeaseId, label: Option<&str>) -> String {
    let state = if held { HELD } else { QUEUED };
    format!("{state}\n{}", value(lease_id, label))
}

const HELD: &str = "held";
const QUEUED: &str = "queued";

/// Whether a shared hold's entry holds the key (rather than waits for it).
pub(crate) fn is_held(value: &[u8]) -> bool {
    value.starts_with(HELD.as_bytes()) && value.get(HELD.len()) == Some(&b'\n')
}

/// The lease id and label an entry's value holds (a shared entry's state line skipped);
/// `None` for an entry that is not distlock's (an `etcdctl lock` or Go mutex entry, whose
/// value is empty).
pub(crate) fn parse_value(value: &[u8]) -> Option<(LeaseId, Option<String>)> {
    let text = std::str::from_utf8(value).ok()?;
    // Lease ids are hex digits: a state line is never taken for one.
    let text = [HELD, QUEUED]
        .iter()
        .find_map(|state| text.strip_prefix(state)?.strip_prefix('\n'))
        .unwrap_or(text);
    let (id, label) = match text.split_once('\n') {
        Some((id, label)) => (id, Some(label.to_string())),
        None => (text, None),
    };
    Some((id.parse().ok()?, label))
}

/// The part of `dir` holding `kind`'s entries.
pub(crate) fn part(dir: &[u8], kind: HoldKind) -> Vec<u8> {
    let mut part = dir.to_vec();
    part.extend_from_slice(&kind_part(kind).unwrap_or_default());
    part
}

/// The keys among `entries` ahead of `own` in a shared queue (sorted by create revision)
/// that stand in its way, and how many of them may stay when its turn comes: for a permit
/// every entry ahead, `limit - 1` staying; for a read the writers ahead, none staying; for
/// a write every entry ahead, none staying. `None` when `own` is not among them.
pub(crate) fn in_the_way(
    dir: &[u8],
    entries: &[KeyValue],
    own: &[u8],
    kind: HoldKind,
) -> Option<(HashSet<Vec<u8>>, usize)> {
    let at = entries.iter().position(|kv| kv.key() == own)?;
    let ahead = entries[..at].iter().map(KeyValue::key);
    Some(match kind {
        HoldKind::Permit { limit } => (
            ahead.map(<[u8]>::to_vec).collect(),
            (limit as usize).saturating_sub(1),
        ),
        HoldKind::Read => {
            let writers = part(dir, HoldKind::Write);
            (
                ahead
                    .filter(|key| key.starts_with(&writers))
                    .map(<[u8]>::to_vec)
                    .collect(),
                0,
            )
        }
        _ => (ahead.map(<[u8]>::to_vec).collect(), 0),
    })
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

    /// The three primitives of one name never share a directory, nor does any semaphore
    /// or reader-writer lock directory lie in the range the mutexes are listed from.
    #[test]
    fn primitives_have_namespaces_of_their_own() {
        for layout in [Layout::Distlock, Layout::EtcdMutex] {
            let space = KeySpace::new("p", layout);
            let name = LockKey::new("k").unwrap();
            let kinds = [
                HoldKind::Mutex,
                HoldKind::Permit { limit: 3 },
                HoldKind::Read,
            ];
            let dirs: Vec<Vec<u8>> = kinds
                .iter()
                .map(|kind| space.dir(&name.held_as(*kind).unwrap()))
                .collect();
            for (i, one) in dirs.iter().enumerate() {
                for (j, other) in dirs.iter().enumerate() {
                    assert!(
                        i == j || !other.starts_with(one),
                        "{one:?} covers {other:?}"
                    );
                }
                assert_eq!(i == 0, one.starts_with(&space.root()), "{one:?}");
            }
            let id = LeaseId::random();
            for kind in [
                HoldKind::Permit { limit: 12 },
                HoldKind::Read,
                HoldKind::Write,
            ] {
                let key = name.held_as(kind).unwrap();
                let entry = space.entry(&key, id, 7);
                let rest = entry.strip_prefix(space.dir(&key).as_slice()).unwrap();
                assert_eq!(kind_of(rest), Some(kind));
                assert_eq!(space.known_entry(&key, id), Some(entry.clone()));
                let root = space.primitive_root(key.primitive());
                assert_eq!(space.user_key_under(&root, &entry).as_deref(), Some("k"));
                let marker = space.marker(&key, id);
                let root = space.markers_root();
                assert_eq!(space.user_key_under(&root, &marker).as_deref(), Some("k"));
                assert!(!marker.starts_with(&space.dir(&key)));
            }
        }
        assert_eq!(kind_of(b"0/x"), None);
        assert_eq!(kind_of(b"x"), None);
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
        let held = shared_value(true, id, Some("a\nb"));
        assert!(is_held(held.as_bytes()));
        assert_eq!(
            parse_value(held.as_bytes()),
            Some((id, Some("a\nb".to_string())))
        );
        let queued = shared_value(false, id, None);
        assert!(!is_held(queued.as_bytes()));
        assert_eq!(parse_value(queued.as_bytes()), Some((id, None)));
        assert_eq!(range_end(b"a/"), b"a0");
        assert_eq!(range_end(b"a\xff"), b"b");
    }
}
