DELETE FROM {table} WHERE lock_key = ? AND expires_at <= {now}
