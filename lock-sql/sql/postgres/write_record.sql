-- Records a result only while the lease holds the key, in one statement: the holder's row
-- is read FOR SHARE, so a takeover or release of it waits until this write committed, and
-- a takeover or release that committed first is seen (the row is re-read after the wait)
-- and the write refused. A holder that lost the key can therefore never record after the
-- next holder took it. An expired record of the key is overwritten.
-- $1 value, $2 fingerprint, $3 token, $4 retention in ms, $5 key, $6 lease id.
INSERT INTO {table}_records AS kept (record_key, value, fingerprint, token, expires_at)
SELECT held.lock_key, $1, $2, $3, {clock} + $4
FROM {table} AS held
WHERE held.lock_key = $5 AND held.lease_id = $6 AND held.expires_at > {now}
FOR SHARE
ON CONFLICT (record_key) DO UPDATE SET
    value = EXCLUDED.value,
    fingerprint = EXCLUDED.fingerprint,
    token = EXCLUDED.token,
    expires_at = EXCLUDED.expires_at
