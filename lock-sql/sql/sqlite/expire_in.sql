UPDATE {table} SET expires_at = {clock} + ?1
WHERE lock_key = ?2 AND lease_id = ?3 AND expires_at > {now}
