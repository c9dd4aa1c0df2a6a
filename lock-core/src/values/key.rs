//! Lock keys: validated once, before any store is touched.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::values::error::{Error, Result};

/// The name of a lock: a non-empty UTF-8 string of at most [`LockKey::MAX_LEN`] bytes
/// without control characters.
///
/// Any other character is allowed, including `/`, `*`, `%`, quotes and non-ASCII text:
/// each backend keeps keys inside its own namespace however they are spelled, which the
/// conformance scenario `hostile_keys_stay_in_their_namespace` proves.
///
/// A key also says which primitive it names and how it is held ([`HoldKind`]): the mutex
/// (what [`new`](Self::new) makes), a semaphore permit, or a reader-writer lock's read or
/// write hold. Each primitive has a namespace of its own in the store: the mutex `"k"`,
/// the semaphore `"k"` and the reader-writer lock `"k"` never contend.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    name: Arc<str>,
    kind: HoldKind,
}

/// How a key is held: which primitive, and in which mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldKind {
    /// The exclusive lock: one holder at a time.
    #[default]
    Mutex,
    /// One permit of a counting semaphore: at most `limit` holders at a time.
    Permit {
        /// How many holders the semaphore admits at once (at least 1).
        limit: u32,
    },
    /// A reader-writer lock's shared hold: many readers at once, never with a writer.
    Read,
    /// A reader-writer lock's exclusive hold: one writer, and no readers meanwhile.
    Write,
}

/// The primitive a [`HoldKind`] belongs to: each has its own namespace of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Primitive {
    /// The exclusive lock.
    Mutex,
    /// The counting semaphore.
    Semaphore,
    /// The reader-writer lock.
    RwLock,
}

impl HoldKind {
    /// The primitive this kind of hold belongs to.
    pub fn primitive(self) -> Primitive {
        match self {
            HoldKind::Mutex => Primitive::Mutex,
            HoldKind::Permit { .. } => Primitive::Semaphore,
            HoldKind::Read | HoldKind::Write => Primitive::RwLock,
        }
    }

    /// Whether several leases may hold the key in this mode at once (a permit, a read).
    pub fn is_shared(self) -> bool {
        matches!(self, HoldKind::Permit { .. } | HoldKind::Read)
    }

    /// A short name for messages and stores: `mutex`, `permit`, `read`, `write`.
    pub fn name(self) -> &'static str {
        match self {
            HoldKind::Mutex => "mutex",
            HoldKind::Permit { .. } => "permit",
            HoldKind::Read => "read",
            HoldKind::Write => "write",
        }
    }
}

impl Primitive {
    /// A short name for messages and stores: `mutex`, `semaphore`, `rwlock`.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore => "semaphore",
            Primitive::RwLock => "rwlock",
        }
    }
}

impl LockKey {
    /// The longest key, in bytes of UTF-8.
    pub const MAX_LEN: usize = 256;

    /// Validates `key`, refusing it with [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput).
    pub fn new(key: impl AsRef<str>) -> Result<Self> {
        let key = key.as_ref();
        if key.is_empty() {
            return Err(Error::invalid("lock key is empty"));
        }
        if key.len() > Self::MAX_LEN {
            return Err(Error::invalid(format!(
                "lock key is {} bytes long; the limit is {}",
                key.len(),
                Self::MAX_LEN
            )));
        }
        if let Some(at) = key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(Error::invalid(format!(
                "lock key has a control character {:?} at byte {}",
                at.1, at.0
            )));
        }
        Ok(LockKey {
            name: Arc::from(key),
            kind: HoldKind::Mutex,
        })
    }

    /// The same name, held as `kind`. A permit's limit of zero is
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput): such a semaphore could
    /// never be held.
    pub fn held_as(&self, kind: HoldKind) -> Result<Self> {
        if kind == (HoldKind::Permit { limit: 0 }) {
            return Err(Error::invalid(format!(
                "semaphore {:?} asked with 0 permits: a semaphore admits at least one holder",
                self.as_str()
            )));
        }
        Ok(LockKey {
            name: Arc::clone(&self.name),
            kind,
        })
    }

    /// How this key is held: the mutex, a permit, a read or a write.
    pub fn kind(&self) -> HoldKind {
        self.kind
    }

    /// The primitive this key names ([`HoldKind::primitive`]).
    pub fn primitive(&self) -> Primitive {
        self.kind.primitive()
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)?;
        match self.kind {
            HoldKind::Mutex => Ok(()),
            HoldKind::Permit { limit } => write!(f, " (permit of {limit})"),
            HoldKind::Read => f.write_str(" (read)"),
            HoldKind::Write => f.write_str(" (write)"),
        }
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

impl FromStr for LockKey {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = Error;

    fn try_from(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<String> for LockKey {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<&LockKey> for LockKey {
    type Error = Error;

    fn try_from(key: &LockKey) -> Result<Self> {
        Ok(key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn accepts_hostile_but_printable_keys() {
        for key in [
            "../x",
            "/",
            "*",
            "%_",
            "'; DROP TABLE locks; --",
            "{tag}",
            "ключ 🔒",
        ] {
            assert_eq!(LockKey::new(key).unwrap().as_str(), key);
        }
        assert!(LockKey::new("é".repeat(128)).is_ok());
    }

    #[test]
    fn refuses_bad_keys() {
        for key in [
            String::new(),
            "a".repeat(257),
            "a\nb".into(),
            "\u{0}".into(),
            "x\u{7f}".into(),
        ] {
            assert_eq!(
                LockKey::new(&key).unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{key:?}"
            );
        }
    }
}
