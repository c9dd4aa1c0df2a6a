UPDATE {table} SET expires_at = {clock} + ?
WHERE lock_key = ? AND lease_id = ? AND expires_at > {now}
