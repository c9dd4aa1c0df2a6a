DELETE FROM {table} WHERE lock_key = ?1 AND lease_id = ?2
RETURNING CASE WHEN expires_at > {now} THEN 1 ELSE 0 END AS live
