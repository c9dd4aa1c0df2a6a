//! Idempotency records: one TTL node per key under `<root>/.records`, written fenced by
//! the writer's lock node in one multi, so a holder that lost its lock cannot record over
//! the next holder's result.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::backend::{Ownership, Record};
use lock_core::{Error, ErrorKind, LeaseId, LockKey, Result};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, MultiWriteError};

use crate::error::into_error;
use crate::keys::{record_path, records_dir};

/// The records of one backend, written and read through its control session.
#[derive(Debug)]
pub(crate) struct Records {
    control: Client,
    root: String,
    acls: Acls<'static>,
}

/// The outcome of one fenced record write.
enum Written {
    Done,
    /// The caller's node is gone: it no longer holds.
    NotHeld,
    /// The record node exists already: replace it.
    Exists,
    /// The record node vanished (expired) before it could be replaced: create it.
    Vanished,
    /// The records directory is missing.
    NoDirectory,
}

impl Records {
    pub(crate) fn new(control: Client, root: String, acls: Acls<'static>) -> Self {
        Records {
            control,
            root,
            acls,
        }
    }

    /// Whether the server creates TTL nodes (idempotency records need them): it refuses
    /// them unless started with `-Dzookeeper.extendedTypesEnabled=true`. The probe asks
    /// for a TTL node under a parent that does not exist, so it creates nothing: the server
    /// checks the node type before it looks for the parent, and answers `Unimplemented`
    /// when TTL nodes are off, `NoNode` when they are on.
    pub(crate) async fn ttl_nodes_enabled(
        control: &Client,
        root: &str,
        acls: Acls<'static>,
    ) -> Result<bool> {
        let path = format!(
            "{}/.ttl-probe-{:032x}/probe",
            records_dir(root),
            LeaseId::random().as_u128()
        );
        let options = CreateMode::Persistent
            .with_acls(acls)
            .with_ttl(Duration::from_secs(1));
        match control.create(&path, &[], &options).await {
            Err(ZkError::Unimplemented) => Ok(false),
            Err(ZkError::NoNode) => Ok(true),
            Ok(_) => {
                // Not expected (the parent was never created); the node expires by its TTL
                // anyway, but is not left to wait for it.
                let _ = control.delete(&path, None).await;
                Ok(true)
            }
            // Another answer (an ACL on the root, say) says nothing about TTL nodes; the
            // record write reports the setting if it is missing.
            Err(ZkError::NoAuth) | Err(ZkError::InvalidAcl) => Ok(true),
            Err(err) => Err(into_error(err, "probing for TTL nodes")),
        }
    }

    /// The record of `key` within its retention.
    pub(crate) async fn read(&self, key: &LockKey) -> Result<Option<Record>> {
        let path = record_path(&self.root, key);
        catch_up(&self.control, &path).await?;
        let (data, stat) = match self.control.get_data(&path).await {
            Ok(found) => found,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(into_error(err, "reading the record")),
        };
        let Some((retention, bytes)) = data.split_first_chunk::<8>() else {
            return Ok(None);
        };
        // The server reaps a TTL node only at its next container check; until then the
        // node's last modification (server time) plus its retention says it is over.
        let retention = i64::from_be_bytes(*retention);
        if stat.mtime.saturating_add(retention) <= wall_millis() {
            return Ok(None);
        }
        Ok(Record::from_bytes(bytes))
    }

    /// Stores `record` for `key`, kept `retention_ms`, while the lock node `holder` exists.
    pub(crate) async fn write(
        &self,
        holder: &str,
        key: &LockKey,
        record: &Record,
        retention_ms: i64,
    ) -> Result<Ownership> {
        let retention = Duration::from_millis(retention_ms.unsigned_abs());
        let path = record_path(&self.root, key);
        let mut data = retention_ms.to_be_bytes().to_vec();
        data.extend_from_slice(&record.to_bytes());
        let mut replace = false;
        for _ in 0..6 {
            match self
                .write_fenced(holder, &path, &data, retention, replace)
                .await?
            {
                Written::Done => return Ok(Ownership::Held),
                Written::NotHeld => return Ok(Ownership::NotHeld),
                Written::Exists => replace = true,
                Written::Vanished => replace = false,
                Written::NoDirectory => {
                    let persistent = CreateMode::Persistent.with_acls(self.acls);
                    self.control
                        .mkdir(&records_dir(&self.root), &persistent)
                        .await
                        .map_err(|err| into_error(err, "creating the records directory"))?;
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "zookeeper: the record kept changing while it was written",
        ))
    }

    /// One multi: `holder` still exists, and the record node is created (after deleting
    /// the one there when `replace`), as a TTL node of `retention`.
    async fn write_fenced(
        &self,
        holder: &str,
        path: &str,
        data: &[u8],
        retention: Duration,
        replace: bool,
    ) -> Result<Written> {
        let options = CreateMode::Persistent
            .with_acls(self.acls)
            .with_ttl(retention);
        let mut multi = self.control.new_multi_writer();
        let add =
            |multi: &mut zookeeper_client::MultiWriter<'_>| -> std::result::Result<(), ZkError> {
                multi.add_check_version(holder, -1)?;
                if replace {
                    multi.add_delete(path, None)?;
                }
                multi.add_create(path, data, &options)
            };
        add(&mut multi).map_err(|err| into_error(err, "writing the record"))?;
        match multi.commit().await {
            Ok(_) => Ok(Written::Done),
            Err(MultiWriteError::OperationFailed {
                index: 0,
                source: ZkError::NoNode,
            }) => Ok(Written::NotHeld),
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NodeExists,
                ..
            }) => Ok(Written::Exists),
            Err(MultiWriteError::OperationFailed {
                index: 1,
                source: ZkError::NoNode,
            }) if replace => Ok(Written::Vanished),
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NoNode,
                ..
            }) => Ok(Written::NoDirectory),
            Err(MultiWriteError::OperationFailed {
                source: ZkError::Unimplemented,
                ..
            })
            | Err(MultiWriteError::RequestFailed {
                source: ZkError::Unimplemented,
            }) => Err(ttl_nodes_disabled()),
            Err(err) => Err(into_error(err.into(), "writing the record")),
        }
    }
}

/// Catches `control`'s server up with the leader, so what another session saw answered
/// is seen through it too.
pub(crate) async fn catch_up(control: &Client, path: &str) -> Result<()> {
    match control.sync(path).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(err) => Err(into_error(err, "syncing")),
    }
}

fn ttl_nodes_disabled() -> Error {
    Error::misconfigured(
        "zookeeper: the server refuses TTL nodes, which idempotency records need; start it \
         with -Dzookeeper.extendedTypesEnabled=true (locks work without it)",
    )
}

/// Milliseconds since the Unix epoch on this machine's clock.
fn wall_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}
