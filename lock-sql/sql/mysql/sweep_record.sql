DELETE FROM {table}_records WHERE record_key = ? AND expires_at <= {now}
