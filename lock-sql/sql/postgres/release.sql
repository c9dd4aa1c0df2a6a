-- The notification is sent on commit, so a woken waiter finds the row gone.
WITH released AS (
    DELETE FROM {table} WHERE lock_key = $1 AND lease_id = $2
    RETURNING lock_key, expires_at > {now} AS live
)
SELECT CASE WHEN live THEN 1 ELSE 0 END::bigint AS live,
       pg_notify('{channel}', lock_key)::text AS notified
FROM released
