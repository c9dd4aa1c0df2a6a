-- Renews a batch of leases in one statement, as renew.sql renews one: ?1 is a JSON array
-- of {"k": key, "l": lease id, "t": TTL in ms}. Answers the leases it renewed.
UPDATE {table} AS held SET expires_at = max(held.expires_at, {clock} + batch.t)
FROM (SELECT value ->> '$.k' AS k, value ->> '$.l' AS l, value ->> '$.t' AS t
      FROM json_each(?1)) AS batch
WHERE held.lock_key = batch.k AND held.lease_id = batch.l AND held.expires_at > {now}
RETURNING lock_key, lease_id
