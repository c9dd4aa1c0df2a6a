-- 'now' is read once per statement, so {now} and {clock} are the same instant; the
-- statement has the shape of the other dialects' (see postgres/acquire.sql).
-- ?4 is the holder label (NULL for none).
INSERT INTO {table} AS held (lock_key, lease_id, token, expires_at, holder)
VALUES (?1, ?2, (SELECT last_token + 1 FROM {table}_tokens WHERE id = 1), {clock} + ?3, ?4)
ON CONFLICT (lock_key) DO UPDATE SET
    token = CASE WHEN held.expires_at > {now} THEN held.token ELSE excluded.token END,
    lease_id = excluded.lease_id,
    holder = excluded.holder,
    expires_at = max(
        CASE WHEN held.lease_id = excluded.lease_id THEN held.expires_at ELSE 0 END,
        {clock} + ?3)
WHERE held.expires_at <= {now} OR held.lease_id = excluded.lease_id
RETURNING lease_id, token, expires_at - {clock} AS remaining_ms
