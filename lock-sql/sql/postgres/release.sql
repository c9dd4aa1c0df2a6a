-- The waiters are told in a statement of its own (notify.sql), after this one committed:
-- a notification that fails (a full queue) must not undo the release.
DELETE FROM {table} WHERE lock_key = $1 AND lease_id = $2
RETURNING CASE WHEN expires_at > {now} THEN 1 ELSE 0 END::bigint AS live
