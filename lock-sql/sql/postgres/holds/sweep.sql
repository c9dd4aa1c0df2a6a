DELETE FROM {table}_holds
WHERE hold_key = $1 AND primitive = $2 AND lease_id = $3 AND expires_at <= {now}
