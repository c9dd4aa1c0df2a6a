SELECT lock_key FROM {table} WHERE expires_at <= {now} LIMIT 1000
