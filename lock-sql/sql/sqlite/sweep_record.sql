DELETE FROM {table}_records WHERE record_key = ?1 AND expires_at <= {now}
