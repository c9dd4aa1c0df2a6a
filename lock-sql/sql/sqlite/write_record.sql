-- Records a result only while the lease holds the key, in one statement: SQLite takes the
-- database's write lock before the statement reads, so no takeover or release can come
-- between the holder check and the write. An expired record of the key is overwritten.
INSERT INTO {table}_records AS kept (record_key, value, fingerprint, token, expires_at)
SELECT held.lock_key, ?1, ?2, ?3, {clock} + ?4
FROM {table} AS held
WHERE held.lock_key = ?5 AND held.lease_id = ?6 AND held.expires_at > {now}
ON CONFLICT (record_key) DO UPDATE SET
    value = excluded.value,
    fingerprint = excluded.fingerprint,
    token = excluded.token,
    expires_at = excluded.expires_at
