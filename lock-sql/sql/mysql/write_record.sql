-- Records a result only while the lease holds the key, in one statement: the holder's row
-- is read with a shared lock (a locking read sees the latest committed row, whatever the
-- isolation level), so a takeover or release of it waits until this write committed, and
-- one that committed first makes the write find no row. A holder that lost the key can
-- therefore never record after the next holder took it. An expired record is overwritten.
INSERT INTO {table}_records (record_key, value, fingerprint, token, expires_at)
SELECT held.lock_key, ?, ?, ?, {clock} + ?
FROM {table} AS held
WHERE held.lock_key = ? AND held.lease_id = ? AND held.expires_at > {now}
LOCK IN SHARE MODE
ON DUPLICATE KEY UPDATE
    value = VALUES(value),
    fingerprint = VALUES(fingerprint),
    token = VALUES(token),
    expires_at = VALUES(expires_at)
