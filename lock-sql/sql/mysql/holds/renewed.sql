-- Which holds of a batch (the JSON array renew_many.sql took) are live: asked right after
-- renew_many.sql renewed fewer than it was given.
SELECT CONVERT(held.hold_key USING utf8mb4) AS hold_key, held.lease_id, held.primitive
FROM {table}_holds AS held
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
    k VARBINARY(256) PATH '$.k',
    p VARCHAR(16) CHARACTER SET ascii PATH '$.p',
    l CHAR(32) CHARACTER SET ascii PATH '$.l')) AS batch
    ON held.hold_key = batch.k AND held.primitive = batch.p AND held.lease_id = batch.l
WHERE held.kind <> 'intent' AND held.expires_at > {now}
