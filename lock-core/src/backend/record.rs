//! The result record of an idempotent run, as a backend stores it.

use std::time::Duration;

use crate::values::error::{Error, ErrorKind, Result};
use crate::values::lease::FencingToken;

/// The longest a record may be kept: thirty years, far beyond any retry and within every
/// store's expiry (ZooKeeper's TTL nodes end first, at 2^40 - 1 ms, about 34.8 years).
pub const MAX_RETENTION: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// What an idempotent run left for its retries: its result, the fingerprint of the request
/// that produced it, and the fencing token of the run that wrote it.
///
/// A backend stores the three together and gives them back unchanged; it need not look
/// inside. The value is opaque bytes (callers serialize as they like).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The run's result.
    pub value: Vec<u8>,
    /// Identifies the request the run answered, when the caller gave one: a retry with a
    /// different fingerprint is refused instead of replayed.
    pub fingerprint: Option<Vec<u8>>,
    /// The fencing token of the ownership under which the run wrote the record.
    pub token: FencingToken,
}

impl Record {
    /// `retention` in whole milliseconds, rounded up so a record is never forgotten early,
    /// and at least one (stores' expiries count in milliseconds);
    /// [`ErrorKind::InvalidInput`] beyond [`MAX_RETENTION`].
    pub fn retention_millis(retention: Duration) -> Result<i64> {
        if retention > MAX_RETENTION {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("retention {retention:?} is longer than {MAX_RETENTION:?}"),
            ));
        }
        // At most thirty years of milliseconds: far below i64::MAX.
        Ok(i64::try_from(retention.as_nanos().div_ceil(1_000_000).max(1)).unwrap_or(i64::MAX))
    }

    /// The record in one self-describing byte string, for stores that keep a single
    /// value: token (8 bytes, big-endian), fingerprint flag and length, fingerprint, value.
    pub fn to_bytes(&self) -> Vec<u8> {
        let fingerprint = self.fingerprint.as_deref();
        let mut bytes =
            Vec::with_capacity(8 + 1 + 4 + fingerprint.map_or(0, <[u8]>::len) + self.value.len());
        bytes.extend_from_slice(&self.token.get().to_be_bytes());
        match fingerprint {
            Some(fingerprint) => {
                bytes.push(1);
                bytes.extend_from_slice(&(fingerprint.len() as u32).to_be_bytes());
                bytes.extend_from_slice(fingerprint);
            }
            None => bytes.push(0),
        }
        bytes.extend_from_slice(&self.value);
        bytes
    }

    /// Reads back [`to_bytes`](Self::to_bytes); `None` for bytes it did not write.
    pub fn from_bytes(bytes: &[u8]) -> Option<Record> {
        let (token, rest) = bytes.split_first_chunk::<8>()?;
        let token = FencingToken::new(u64::from_be_bytes(*token));
        let (flag, rest) = rest.split_first()?;
        let (fingerprint, value) = match flag {
            0 => (None, rest),
            1 => {
                let (len, rest) = rest.split_first_chunk::<4>()?;
                let len = u32::from_be_bytes(*len) as usize;
                if rest.len() < len {
                    return None;
                }
                let (fingerprint, value) = rest.split_at(len);
                (Some(fingerprint.to_vec()), value)
            }
            _ => return None,
        };
        Some(Record {
            value: value.to_vec(),
            fingerprint,
            token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_garbage_is_refused() {
        for fingerprint in [None, Some(Vec::new()), Some(b"req-1".to_vec())] {
            for value in [Vec::new(), b"result".to_vec(), vec![0, 1, 255]] {
                let record = Record {
                    value,
                    fingerprint: fingerprint.clone(),
                    token: FencingToken::new(u64::MAX - 3),
                };
                assert_eq!(Record::from_bytes(&record.to_bytes()), Some(record));
            }
        }
        assert_eq!(Record::from_bytes(b"short"), None);
        assert_eq!(Record::from_bytes(&[0, 0, 0, 0, 0, 0, 0, 1, 2]), None);
        assert_eq!(
            Record::from_bytes(&[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 9, 1]),
            None
        );
    }

    #[test]
    fn retention_rounds_up_to_whole_milliseconds_within_thirty_years() {
        let millis = |retention| Record::retention_millis(retention).ok();
        assert_eq!(millis(Duration::from_nanos(1)), Some(1));
        assert_eq!(millis(Duration::from_micros(1500)), Some(2));
        assert_eq!(millis(Duration::from_secs(2)), Some(2000));
        assert_eq!(millis(MAX_RETENTION), Some(946_080_000_000));
        let too_long = Record::retention_millis(MAX_RETENTION + Duration::from_secs(1));
        assert_eq!(too_long.map_err(|e| e.kind()), Err(ErrorKind::InvalidInput));
    }
}
