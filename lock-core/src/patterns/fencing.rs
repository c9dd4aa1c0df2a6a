//! A resource that refuses writes from stale lock holders.

use std::sync::Mutex;

use crate::values::lease::FencingToken;

/// A stand-in for a storage service that checks fencing tokens: it accepts a write only
/// with a token at least as high as the highest it has seen, so a holder whose lease
/// expired (paused by GC, a slow network, a suspended VM) cannot overwrite the work of the
/// holder that came after it.
///
/// ```
/// use lock_core::{FencedResource, FencingToken};
///
/// let resource = FencedResource::new(0u32);
/// assert!(resource.write(FencingToken::new(2), |v| *v += 1).is_ok());
/// // A holder with an older token is refused.
/// assert!(resource.write(FencingToken::new(1), |v| *v += 1).is_err());
/// assert_eq!(resource.read(|v| *v), 1);
/// ```
#[derive(Debug, Default)]
pub struct FencedResource<T> {
    state: Mutex<(Option<FencingToken>, T)>,
}

/// A write refused because a newer token has been seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleToken {
    /// The token of the refused write.
    pub offered: FencingToken,
    /// The highest token the resource has accepted.
    pub highest: FencingToken,
}

impl std::fmt::Display for StaleToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fencing token {} is older than {}, already seen",
            self.offered, self.highest
        )
    }
}

impl std::error::Error for StaleToken {}

impl<T> FencedResource<T> {
    /// A resource holding `value` that has seen no token yet.
    pub fn new(value: T) -> Self {
        FencedResource {
            state: Mutex::new((None, value)),
        }
    }

    /// Applies `write` if `token` is not older than any token seen so far.
    pub fn write<R>(
        &self,
        token: FencingToken,
        write: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut state = crate::backend::sync::lock_unpoisoned(&self.state);
        if let Some(highest) = state.0 {
            if token < highest {
                return Err(StaleToken {
                    offered: token,
                    highest,
                });
            }
        }
        state.0 = Some(token);
        Ok(write(&mut state.1))
    }

    /// Reads the value.
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        let state = crate::backend::sync::lock_unpoisoned(&self.state);
        read(&state.1)
    }

    /// The highest token accepted so far.
    pub fn highest_token(&self) -> Option<FencingToken> {
        crate::backend::sync::lock_unpoisoned(&self.state).0
    }
}
