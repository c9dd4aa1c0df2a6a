INSERT INTO {table} AS held (lock_key, lease_id, token, expires_at)
VALUES (?1, ?2, (SELECT last_token + 1 FROM {table}_tokens WHERE id = 1), {now} + ?3)
ON CONFLICT (lock_key) DO UPDATE SET
    token = CASE WHEN held.expires_at > {now} THEN held.token ELSE excluded.token END,
    lease_id = excluded.lease_id,
    expires_at = excluded.expires_at
WHERE held.expires_at <= {now} OR held.lease_id = excluded.lease_id
RETURNING lease_id, token
