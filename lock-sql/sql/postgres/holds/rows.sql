-- Every entry of the key left by clear.sql (all live): holds and writer intents.
SELECT lease_id, kind, permits, token FROM {table}_holds
WHERE hold_key = $1 AND primitive = $2
