-- A plain read (no locks), as expired.sql.
SELECT CONVERT(record_key USING utf8mb4) AS record_key FROM {table}_records
WHERE expires_at <= {now} LIMIT 1000
