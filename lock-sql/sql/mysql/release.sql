DELETE FROM {table} WHERE lock_key = ? AND lease_id = ?
RETURNING CAST(expires_at > {now} AS SIGNED) AS live
