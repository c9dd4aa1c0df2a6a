SELECT lease_id, token, expires_at - {now} AS remaining_ms, holder
FROM {table} WHERE lock_key = ?1 AND expires_at > {now}
