-- The shared holds of a renewal batch (renew_many.sql renews the mutexes'): $1 is a JSON
-- array of {"k": key, "p": primitive, "l": lease id, "t": TTL in ms}. Answers the holds
-- it renewed.
UPDATE {table}_holds AS held SET expires_at = GREATEST(held.expires_at, {clock} + batch.t)
FROM json_to_recordset($1::json) AS batch(k text, p text, l text, t bigint)
WHERE held.hold_key = batch.k AND held.primitive = batch.p AND held.lease_id = batch.l
  AND held.kind <> 'intent' AND held.expires_at > {now}
RETURNING held.hold_key, held.lease_id, held.primitive
