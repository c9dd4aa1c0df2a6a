INSERT INTO {table} AS held (lock_key, lease_id, token, expires_at)
VALUES ($1, $2, nextval('{table}_tokens'), {now} + $3)
ON CONFLICT (lock_key) DO UPDATE SET
    token = CASE WHEN held.expires_at > {now} THEN held.token ELSE EXCLUDED.token END,
    lease_id = EXCLUDED.lease_id,
    expires_at = EXCLUDED.expires_at
WHERE held.expires_at <= {now} OR held.lease_id = EXCLUDED.lease_id
RETURNING lease_id, token
