-- The shared holds of a renewal batch (renew_many.sql renews the mutexes'): ?1 is a JSON
-- array of {"k": key, "p": primitive, "l": lease id, "t": TTL in ms}. Answers the holds
-- it renewed.
UPDATE {table}_holds AS held SET expires_at = max(held.expires_at, {clock} + batch.t)
FROM (SELECT value ->> '$.k' AS k, value ->> '$.p' AS p, value ->> '$.l' AS l,
             value ->> '$.t' AS t
      FROM json_each(?1)) AS batch
WHERE held.hold_key = batch.k AND held.primitive = batch.p AND held.lease_id = batch.l
  AND held.kind <> 'intent' AND held.expires_at > {now}
RETURNING hold_key, lease_id, primitive
