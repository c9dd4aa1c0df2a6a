-- A plain read (no locks), as expired.sql.
SELECT CONVERT(hold_key USING utf8mb4) AS hold_key, primitive, lease_id FROM {table}_holds
WHERE expires_at <= {now} LIMIT 1000
