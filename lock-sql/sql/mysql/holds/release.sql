-- Removes the lease's entry, a hold or only its writer intent; live only if a live hold.
DELETE FROM {table}_holds WHERE hold_key = ? AND primitive = ? AND lease_id = ?
RETURNING CAST(expires_at > {now} AND kind <> 'intent' AS SIGNED) AS live
