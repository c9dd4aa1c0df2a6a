-- Which leases of a batch (the JSON array renew_many.sql took) are live: asked right after
-- renew_many.sql renewed fewer leases than it was given. A live lease of the batch was
-- renewed by it: nothing but an acquisition of the same lease id writes a row of that id.
SELECT CONVERT(held.lock_key USING utf8mb4) AS lock_key, held.lease_id
FROM {table} AS held
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
    k VARBINARY(256) PATH '$.k',
    l CHAR(32) CHARACTER SET ascii PATH '$.l')) AS batch
    ON held.lock_key = batch.k AND held.lease_id = batch.l
WHERE held.expires_at > {now}
