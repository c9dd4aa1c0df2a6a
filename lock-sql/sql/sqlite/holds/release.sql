-- Removes the lease's entry, a hold or only its writer intent; live only if a live hold.
DELETE FROM {table}_holds WHERE hold_key = ?1 AND primitive = ?2 AND lease_id = ?3
RETURNING CASE WHEN expires_at > {now} AND kind <> 'intent' THEN 1 ELSE 0 END AS live
