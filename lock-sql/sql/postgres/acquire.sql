-- Whether the old lease is over is judged once, at the statement's start ({now}); the
-- expiry written counts from the moment of writing ({clock}), so a grant that waited for
-- the row lock is not born expired. A takeover draws its token only here, under the row
-- lock, so tokens follow the order in which the row is granted. A grant of the caller's
-- own lease (a retried request) never shortens the expiry a later attempt already wrote.
INSERT INTO {table} AS held (lock_key, lease_id, token, expires_at)
VALUES ($1, $2, nextval('{table}_tokens'), {clock} + $3)
ON CONFLICT (lock_key) DO UPDATE SET
    token = CASE WHEN held.expires_at > {now} THEN held.token
                 ELSE nextval('{table}_tokens') END,
    lease_id = EXCLUDED.lease_id,
    expires_at = GREATEST(
        CASE WHEN held.lease_id = EXCLUDED.lease_id THEN held.expires_at ELSE 0 END,
        {clock} + $3)
WHERE held.expires_at <= {now} OR held.lease_id = EXCLUDED.lease_id
RETURNING lease_id, token, expires_at - {clock} AS remaining_ms
