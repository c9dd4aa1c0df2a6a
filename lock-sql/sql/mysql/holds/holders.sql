-- The live holders of a shared key, oldest grant (lowest token) first.
SELECT lease_id, token, expires_at - {now} AS remaining_ms, holder, kind, permits
FROM {table}_holds
WHERE hold_key = ? AND primitive = ? AND kind <> 'intent' AND expires_at > {now}
ORDER BY token
