DELETE FROM {table}_holds
WHERE hold_key = ? AND primitive = ? AND lease_id = ? AND expires_at <= {now}
