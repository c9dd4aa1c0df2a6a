DELETE FROM {table} WHERE lock_key = ?1 AND expires_at <= {now}
