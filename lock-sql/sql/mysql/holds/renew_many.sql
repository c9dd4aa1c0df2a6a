-- The shared holds of a renewal batch (renew_many.sql renews the mutexes'): ? is a JSON
-- array of {"k": key, "p": primitive, "l": lease id, "t": TTL in ms}. Returns no rows;
-- the backend counts the matched ones and only when some hold was not renewed asks
-- which (renewed.sql).
UPDATE {table}_holds AS held
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
    k VARBINARY(256) PATH '$.k',
    p VARCHAR(16) CHARACTER SET ascii PATH '$.p',
    l CHAR(32) CHARACTER SET ascii PATH '$.l',
    t BIGINT PATH '$.t')) AS batch
    ON held.hold_key = batch.k AND held.primitive = batch.p AND held.lease_id = batch.l
SET held.expires_at = GREATEST(held.expires_at, {clock} + batch.t)
WHERE held.kind <> 'intent' AND held.expires_at > {now}
