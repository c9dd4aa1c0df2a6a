-- A plain read (no locks): a locking scan would wait for, and block, live rows.
SELECT CONVERT(lock_key USING utf8mb4) AS lock_key FROM {table} WHERE expires_at <= {now}
LIMIT 1000
