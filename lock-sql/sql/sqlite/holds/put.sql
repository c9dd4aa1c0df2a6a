-- Writes the lease's entry: a grant (kind permit, read or write, with its token) or a
-- waiting writer's intent (token 0). The expiry counts from now; a retry of the same kind
-- never shortens the expiry already written. ?8 is the holder label (NULL for none).
INSERT INTO {table}_holds AS held
    (hold_key, primitive, lease_id, kind, permits, token, expires_at, holder)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, {clock} + ?7, ?8)
ON CONFLICT (hold_key, primitive, lease_id) DO UPDATE SET
    expires_at = max(CASE WHEN held.kind = excluded.kind THEN held.expires_at ELSE 0 END,
                     excluded.expires_at),
    kind = excluded.kind,
    permits = excluded.permits,
    token = excluded.token,
    holder = excluded.holder
