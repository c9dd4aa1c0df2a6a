//! Detached holds (once tickets, [`AcquireRequest::detached`]): a lock node that no
//! session keeps or ends, a persistent-sequential TTL node in the key's queue, which
//! lives by its TTL alone, judged by the server's clock.
//!
//! The server deletes a TTL node once it has not been written for its TTL, but only
//! lazily (every `znode.container.checkIntervalMs`, a minute by default), and it hides a
//! node's TTL from clients (its `ephemeralOwner` reads 0). So a detached node is created
//! with the longest TTL a hold may have, names its own TTL in its data (the first line,
//! as every lock node's), and contenders judge its end themselves: its latest write's
//! `mtime` plus that TTL, against the `mtime` of a write of their own.
//!
//! [`AcquireRequest::detached`]: lock_core::backend::AcquireRequest::detached

/// How long after its latest write (its `mtime`) the hold of a lock node read as `data`,
/// with `ephemeralOwner` `owner`, ends, in ms, if it is a detached hold: a node of no
/// session whose data starts with a TTL. (Callers look only at nodes named as this
/// crate names them.) `None` for any other node, which no judgment of ours ends.
pub(crate) fn held_for(data: &[u8], owner: i64) -> Option<i64> {
    if owner != 0 {
        return None;
    }
    std::str::from_utf8(data)
        .ok()
        .and_then(|text| text.split('\n').next())
        .and_then(|ttl| ttl.parse::<i64>().ok())
}

/// `data` with its TTL line set to `ttl_ms`, the rest (the holder label) kept.
pub(crate) fn with_ttl(data: &[u8], ttl_ms: u128) -> Vec<u8> {
    let rest = data
        .iter()
        .position(|&b| b == b'\n')
        .map_or(&[][..], |at| &data[at..]);
    let mut rewritten = ttl_ms.to_string().into_bytes();
    rewritten.extend_from_slice(rest);
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sessionless_node_naming_a_ttl_is_a_detached_hold() {
        assert_eq!(held_for(b"300\nlabel", 0), Some(300));
        assert_eq!(held_for(b"300", 0), Some(300));
        // A session's node (an ephemeral one of server 1), and data of another recipe.
        assert_eq!(held_for(b"300", 0x0100_0000_0000_0001), None);
        assert_eq!(held_for(b"host-1", 0), None);
        assert_eq!(held_for(b"", 0), None);
    }

    #[test]
    fn rewriting_the_ttl_keeps_the_label() {
        assert_eq!(with_ttl(b"5000\nweb-1", 250), b"250\nweb-1");
        assert_eq!(with_ttl(b"5000", 250), b"250");
    }
}
