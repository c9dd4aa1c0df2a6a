//! Semaphores and reader-writer locks: where their nodes live, how the nodes are named,
//! and the rank rules that decide whether a node's turn has come.
//!
//! A shared key queues exactly as a mutex does (one ephemeral-sequential node per holder
//! or waiter, in one container parent per key), but in a parent of its own primitive, and
//! its node names say how they hold: the semaphore's limit, a read or a write. Where a
//! node stands in the queue, and the kinds of the nodes ahead of it, decide its turn
//! ([`rank`]); nodes are only ever added behind, so a node whose turn has come keeps it
//! for as long as it exists.

use lock_core::{Error, ErrorKind, HoldKind, LeaseId, LockKey, Primitive, Result};

use crate::keys::{decode_key, encode_key, lock_parent, node_prefix as mutex_prefix, protected};
use crate::keys::{Contender, Layout};

/// The parent of `key`'s nodes for the primitive `key` names.
///
/// In the distlock layout a semaphore's parent is `<root>/<escaped key>.semaphore` and a
/// reader-writer lock's `<root>/<escaped key>.rwlock`: an escaped key never holds a `.`, so
/// neither is any mutex's parent (nor the records directory, `.records`). In the curator
/// layout a reader-writer lock is its path, as kazoo's `ReadLock`/`WriteLock` use it; a
/// semaphore there is refused (see the crate docs, *Semaphores and reader-writer locks*).
pub(crate) fn parent(layout: Layout, root: &str, key: &LockKey) -> Result<String> {
    match (key.primitive(), layout) {
        (Primitive::Mutex, _) | (Primitive::RwLock, Layout::Curator) => {
            lock_parent(layout, root, key)
        }
        (primitive, Layout::Distlock) => Ok(format!(
            "{root}/{}.{}",
            encode_key(key.as_str()),
            primitive.name()
        )),
        (Primitive::Semaphore, Layout::Curator) => Err(Error::new(
            ErrorKind::Unsupported,
            "zookeeper: with layout=curator semaphores are refused: kazoo's Semaphore keeps \
             its limit on a persistent node for ever and grants leases under a lock of its \
             own, which distlock's queued permits do not follow; use the distlock layout",
        )),
    }
}

/// The key whose parent (of any primitive) in the distlock layout is the root's child
/// `name`, if it is one.
pub(crate) fn key_of_parent(name: &str) -> Option<String> {
    let escaped = [Primitive::Semaphore, Primitive::RwLock]
        .into_iter()
        .find_map(|primitive| name.strip_suffix(&format!(".{}", primitive.name())))
        .unwrap_or(name);
    decode_key(escaped)
}

/// The name prefix of `lease`'s node holding `kind` (the server appends the sequence).
///
/// distlock layout: `_c_<uuid>-lock-` (mutex), `_c_<uuid>-permit-<limit>-`,
/// `_c_<uuid>-read-`, `_c_<uuid>-write-`. Curator layout, reader-writer lock: kazoo's
/// `<lease id in 32 hex digits>__rlock__` and `…__lock__`, the names its `ReadLock` and
/// `WriteLock` give their nodes (kazoo's own uuid prefix is a lease id to us).
pub(crate) fn node_prefix(layout: Layout, kind: HoldKind, lease: LeaseId) -> String {
    match (kind, layout) {
        (HoldKind::Mutex, _) => mutex_prefix(lease),
        (HoldKind::Permit { limit }, _) => format!("{}permit-{limit}-", protected(lease)),
        (HoldKind::Read, Layout::Distlock) => format!("{}read-", protected(lease)),
        (HoldKind::Write, Layout::Distlock) => format!("{}write-", protected(lease)),
        (HoldKind::Read, Layout::Curator) => format!("{}{READ_KAZOO}", lease_hex(lease)),
        (HoldKind::Write, Layout::Curator) => format!("{}__lock__", lease_hex(lease)),
    }
}

/// kazoo's name for a read node, after its uuid.
const READ_KAZOO: &str = "__rlock__";

fn lease_hex(lease: LeaseId) -> String {
    format!("{:032x}", lease.as_u128())
}

/// Whether the node `name` of a reader-writer lock is a read: ours (`-read-`), kazoo's
/// (`__rlock__`) or Curator's `InterProcessReadWriteLock`'s (`__READ__`). Every other
/// node is taken for a write, which excludes everyone: a name we cannot read never lets
/// two holders in.
fn is_read(name: &str) -> bool {
    // A protected name's UUID holds only hex digits and dashes, so `-read-` is the kind.
    name.contains("-read-") || name.contains(READ_KAZOO) || name.contains("__READ__")
}

/// The limit a permit node's name carries (`…-permit-<limit>-<sequence>`).
fn permit_limit(name: &str) -> Option<u32> {
    let (_, rest) = name.split_once("-permit-")?;
    rest.split('-').next()?.parse().ok()
}

/// How the node `name` in a parent of `primitive` holds, as far as its name tells.
pub(crate) fn kind_of(primitive: Primitive, name: &str) -> Option<HoldKind> {
    match primitive {
        Primitive::Mutex => Some(HoldKind::Mutex),
        Primitive::Semaphore => permit_limit(name).map(|limit| HoldKind::Permit { limit }),
        Primitive::RwLock if is_read(name) => Some(HoldKind::Read),
        Primitive::RwLock => Some(HoldKind::Write),
    }
}

/// Where a node stands: its turn has come, or it waits for some of the nodes ahead.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rank {
    /// The node may hold the key.
    Turn,
    /// Behind: the node's turn may come only once one of `deciders` (nodes ahead of it) is
    /// gone; when `decisive`, the deletion of any one of them alone brings it (no node
    /// can be created ahead of it), so the next attempt needs no look at the queue.
    Behind {
        deciders: Vec<String>,
        decisive: bool,
    },
}

/// The rank of the node at `at` in `queue` (in creation order), held as `kind`:
/// - a mutex or a write: its turn when it is first; it waits for the node just ahead;
/// - a read: its turn when no write is ahead; it waits for the nearest write ahead;
/// - a permit: its turn when fewer than `limit` nodes are ahead; it waits for the
///   `limit` nearest nodes ahead, one of which is gone whenever enough nodes ahead are
///   (fewer than `limit` watched would miss a release among the others).
///
/// A permit whose limit is not the oldest node's makes the request
/// [`ErrorKind::InvalidInput`], naming both limits: the semaphore's limit is its oldest
/// node's (so it changes once the semaphore is empty), and only the node that disagrees
/// with it is refused, not those behind a disagreeing node.
pub(crate) fn rank(key: &LockKey, kind: HoldKind, queue: &[Contender], at: usize) -> Result<Rank> {
    let ahead = &queue[..at];
    let name = |at: usize| queue[at].name.clone();
    Ok(match kind {
        HoldKind::Mutex | HoldKind::Write => match at {
            0 => Rank::Turn,
            _ => Rank::Behind {
                deciders: vec![name(at - 1)],
                decisive: at == 1,
            },
        },
        HoldKind::Read => match ahead.iter().rposition(|node| !is_read(&node.name)) {
            None => Rank::Turn,
            Some(write) => Rank::Behind {
                deciders: vec![name(write)],
                decisive: write == 0,
            },
        },
        HoldKind::Permit { limit } => {
            if let Some(theirs) = ahead
                .first()
                .and_then(|oldest| permit_limit(&oldest.name))
                .filter(|&theirs| theirs != limit)
            {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "semaphore {:?} is held or awaited with a limit of {theirs}; this \
                         request asked for {limit} (the limit changes once nobody holds or \
                         waits for it)",
                        key.as_str()
                    ),
                ));
            }
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            if at < limit {
                Rank::Turn
            } else {
                Rank::Behind {
                    deciders: (at - limit..at).map(name).collect(),
                    decisive: at == limit,
                }
            }
        }
    })
}

/// Whether the node at `at` in `queue`, in a parent of `primitive`, may hold the key by
/// its kind and rank (a node whose kind its name does not tell never does).
pub(crate) fn holds(key: &LockKey, primitive: Primitive, queue: &[Contender], at: usize) -> bool {
    kind_of(primitive, &queue[at].name)
        .is_some_and(|kind| matches!(rank(key, kind, queue, at), Ok(Rank::Turn)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::contenders;

    fn queue(names: &[&str]) -> Vec<Contender> {
        contenders(
            names
                .iter()
                .enumerate()
                .map(|(seq, name)| format!("{name}{seq:010}"))
                .collect(),
        )
    }

    fn key(kind: HoldKind) -> LockKey {
        LockKey::new("k").unwrap().held_as(kind).unwrap()
    }

    fn seq(names: &[Contender], at: usize) -> Vec<String> {
        vec![names[at].name.clone()]
    }

    #[test]
    fn primitives_have_parents_of_their_own() {
        let root = "/distlock";
        let mutex = LockKey::new("a.b/c").unwrap();
        let parents: Vec<String> = [
            HoldKind::Mutex,
            HoldKind::Permit { limit: 2 },
            HoldKind::Read,
            HoldKind::Write,
        ]
        .into_iter()
        .map(|kind| parent(Layout::Distlock, root, &mutex.held_as(kind).unwrap()).unwrap())
        .collect();
        assert_eq!(parents[0], "/distlock/a%2Eb%2Fc");
        assert_eq!(parents[1], "/distlock/a%2Eb%2Fc.semaphore");
        assert_eq!(parents[2], "/distlock/a%2Eb%2Fc.rwlock");
        assert_eq!(parents[2], parents[3]);
        for parent in &parents {
            let name = parent.strip_prefix("/distlock/").unwrap();
            assert_eq!(key_of_parent(name).as_deref(), Some("a.b/c"));
        }
        assert_eq!(key_of_parent(".records"), None);
        let curator = LockKey::new("locks/x").unwrap();
        assert_eq!(
            parent(
                Layout::Curator,
                root,
                &curator.held_as(HoldKind::Read).unwrap()
            )
            .unwrap(),
            "/locks/x"
        );
        let refused = parent(
            Layout::Curator,
            root,
            &curator.held_as(HoldKind::Permit { limit: 2 }).unwrap(),
        );
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::Unsupported);
    }

    #[test]
    fn names_tell_the_kind_and_the_lease() {
        let lease = LeaseId::random();
        for (layout, kind) in [
            (Layout::Distlock, HoldKind::Permit { limit: 7 }),
            (Layout::Distlock, HoldKind::Read),
            (Layout::Distlock, HoldKind::Write),
            (Layout::Curator, HoldKind::Read),
            (Layout::Curator, HoldKind::Write),
        ] {
            let name = format!("{}0000000003", node_prefix(layout, kind, lease));
            let node = &contenders(vec![name.clone()])[0];
            assert_eq!(node.lease_id(), Some(lease), "{name}");
            assert_eq!(node.sequence, 3, "{name}");
            assert_eq!(kind_of(kind.primitive(), &name), Some(kind), "{name}");
        }
        // A negative sequence after a permit's limit.
        let name = format!(
            "{}-000000004",
            node_prefix(Layout::Distlock, HoldKind::Permit { limit: 7 }, lease)
        );
        assert_eq!(contenders(vec![name])[0].sequence, -4);
        // Curator's own reader-writer lock names.
        assert_eq!(
            kind_of(Primitive::RwLock, "_c_x-__READ__0000000001"),
            Some(HoldKind::Read)
        );
        assert_eq!(
            kind_of(Primitive::RwLock, "_c_x-__WRIT__0000000001"),
            Some(HoldKind::Write)
        );
    }

    #[test]
    fn readers_share_and_a_writer_ahead_stops_them() {
        let q = queue(&[
            "_c_a-read-",
            "_c_b-read-",
            "_c_c-write-",
            "_c_d-read-",
            "e__rlock__",
        ]);
        let k = key(HoldKind::Read);
        assert_eq!(rank(&k, HoldKind::Read, &q, 0).unwrap(), Rank::Turn);
        assert_eq!(rank(&k, HoldKind::Read, &q, 1).unwrap(), Rank::Turn);
        let behind_writer = Rank::Behind {
            deciders: seq(&q, 2),
            decisive: false,
        };
        assert_eq!(rank(&k, HoldKind::Write, &q, 2).unwrap(), {
            Rank::Behind {
                deciders: seq(&q, 1),
                decisive: false,
            }
        });
        assert_eq!(rank(&k, HoldKind::Read, &q, 3).unwrap(), behind_writer);
        assert_eq!(rank(&k, HoldKind::Read, &q, 4).unwrap(), behind_writer);
        let holding: Vec<bool> = (0..q.len())
            .map(|at| holds(&k, Primitive::RwLock, &q, at))
            .collect();
        assert_eq!(holding, [true, true, false, false, false]);
        // A writer first holds alone; the readers behind wait for it, decisively.
        let q = queue(&["_c_c-write-", "_c_d-read-"]);
        assert_eq!(
            rank(&k, HoldKind::Read, &q, 1).unwrap(),
            Rank::Behind {
                deciders: seq(&q, 0),
                decisive: true
            }
        );
    }

    #[test]
    fn permits_count_the_nodes_ahead() {
        let k = key(HoldKind::Permit { limit: 2 });
        let two = HoldKind::Permit { limit: 2 };
        let q = queue(&[
            "_c_a-permit-2-",
            "_c_b-permit-2-",
            "_c_c-permit-2-",
            "_c_d-permit-2-",
        ]);
        assert_eq!(rank(&k, two, &q, 1).unwrap(), Rank::Turn);
        assert_eq!(
            rank(&k, two, &q, 2).unwrap(),
            Rank::Behind {
                deciders: vec![q[0].name.clone(), q[1].name.clone()],
                decisive: true
            }
        );
        assert_eq!(
            rank(&k, two, &q, 3).unwrap(),
            Rank::Behind {
                deciders: vec![q[1].name.clone(), q[2].name.clone()],
                decisive: false
            }
        );
        let err = rank(&k, HoldKind::Permit { limit: 5 }, &q, 3).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains('2') && err.to_string().contains('5'));
        // The disagreeing node behind holds nothing and stops nobody ahead of it; one
        // behind it that agrees with the oldest is not refused for it.
        let q = queue(&["_c_a-permit-2-", "_c_b-permit-5-", "_c_c-permit-2-"]);
        assert_eq!(rank(&k, two, &q, 0).unwrap(), Rank::Turn);
        assert!(!holds(&k, Primitive::Semaphore, &q, 1));
        assert!(rank(&k, two, &q, 2).is_ok());
    }
}
