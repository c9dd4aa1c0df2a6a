-- Assignments apply left to right and later ones see earlier results: the token is
-- decided on the old row, then the lease, then the expiry (which follows the new lease).
INSERT INTO {table} (lock_key, lease_id, token, expires_at) VALUES (?, ?, 0, {now} + ?)
ON DUPLICATE KEY UPDATE
    token = IF(expires_at <= {now}, VALUES(token), token),
    lease_id = IF(expires_at <= {now} OR lease_id = VALUES(lease_id), VALUES(lease_id), lease_id),
    expires_at = IF(lease_id = VALUES(lease_id), VALUES(expires_at), expires_at)
RETURNING lease_id, token
