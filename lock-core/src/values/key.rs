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
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

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
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
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
