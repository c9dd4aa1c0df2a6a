-- Writes the lease's entry: a grant (kind permit, read or write, with its token) or a
-- waiting writer's intent (token 0). The expiry counts from the moment of writing; a
-- retry of the same kind never shortens the expiry already written. The expiry is
-- assigned first: MariaDB's assignments see the new values of those before them. The
-- last parameter is the holder label (NULL for none).
INSERT INTO {table}_holds
    (hold_key, primitive, lease_id, kind, permits, token, expires_at, holder)
VALUES (?, ?, ?, ?, ?, ?, {clock} + ?, ?)
ON DUPLICATE KEY UPDATE
    expires_at = GREATEST(IF(kind = VALUES(kind), expires_at, 0), VALUES(expires_at)),
    kind = VALUES(kind),
    permits = VALUES(permits),
    token = VALUES(token),
    holder = VALUES(holder)
