-- Renews a batch of leases in one statement, as renew.sql renews one: $1 is a JSON array
-- of {"k": key, "l": lease id, "t": TTL in ms}. Answers the leases it renewed.
UPDATE {table} AS held SET expires_at = GREATEST(held.expires_at, {clock} + batch.t)
FROM json_to_recordset($1::json) AS batch(k text, l text, t bigint)
WHERE held.lock_key = batch.k AND held.lease_id = batch.l AND held.expires_at > {now}
RETURNING held.lock_key, held.lease_id
