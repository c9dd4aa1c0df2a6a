SELECT record_key FROM {table}_records WHERE expires_at <= {now} LIMIT 1000
