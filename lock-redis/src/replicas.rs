//! Writes confirmed by replicas: `WAIT` after a grant, renewal or record write, on the
//! connection that carried it (the `replicas` option; see docs.md for what it promises).

use std::time::Duration;

use lock_core::{Error, ErrorKind, Result};

use crate::config::{RedisConfig, Replicas};
use crate::node::Pinned;

/// How many replicas must have a write, and how long to wait for them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Confirmation {
    replicas: Replicas,
    timeout: Duration,
}

impl Confirmation {
    /// The confirmation `config` asks for, if any.
    pub(crate) fn of(config: &RedisConfig) -> Option<Self> {
        config.replicas.map(|replicas| Confirmation {
            replicas,
            timeout: config.replica_timeout,
        })
    }

    /// Waits until enough replicas have every write sent on `pinned` so far; fewer within
    /// the time-out is [`ErrorKind::Unavailable`] naming how many of how many confirmed.
    /// Only `WAIT` is used (replicas' memory), never `WAITAOF` (Redis 7.2+: their disks).
    pub(crate) async fn confirm(&self, pinned: &Pinned<'_>, what: &str) -> Result<()> {
        let wanted = match self.replicas {
            Replicas::Count(count) => u64::from(count.get()),
            Replicas::AllConnected => {
                let info: String = pinned
                    .query(redis::cmd("INFO").arg("replication"), what)
                    .await?;
                online_replicas(&info)
            }
        };
        if wanted == 0 {
            return Ok(());
        }
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let confirmed: u64 = pinned
            .query(redis::cmd("WAIT").arg(wanted).arg(timeout_ms), what)
            .await?;
        if confirmed >= wanted {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "redis {}: {what} confirmed by {confirmed} of {wanted} replicas within {:?}",
                pinned.node().shown(),
                self.timeout
            ),
        ))
    }
}

/// Replicas `INFO replication` lists as online (`slaveN:ip=...,state=online,...`); one
/// still loading the primary's snapshot would never confirm in time, so it is not counted.
fn online_replicas(info: &str) -> u64 {
    let online = info.lines().filter(|line| {
        line.strip_prefix("slave")
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(index, fields)| {
                index.bytes().all(|b| b.is_ascii_digit())
                    && fields.split(',').any(|field| field == "state=online")
            })
    });
    u64::try_from(online.count()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_online_replicas_count() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
            slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=127.0.0.1,port=7003,state=online,offset=42,lag=1\r\n\
            slave_read_repl_offset:42\r\nmaster_repl_offset:42\r\n";
        assert_eq!(online_replicas(info), 2);
        assert_eq!(online_replicas("role:master\r\nconnected_slaves:0\r\n"), 0);
    }
}
