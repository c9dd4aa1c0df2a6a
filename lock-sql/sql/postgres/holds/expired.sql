SELECT hold_key, primitive, lease_id FROM {table}_holds WHERE expires_at <= {now} LIMIT 1000
