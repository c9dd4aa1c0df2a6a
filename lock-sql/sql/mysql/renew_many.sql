-- Renews a batch of leases in one statement, as renew.sql renews one: ? is a JSON array
-- of {"k": key, "l": lease id, "t": TTL in ms}. MariaDB's UPDATE returns no rows; the
-- backend counts the matched ones, and only when some lease was not renewed asks which
-- (renewed.sql).
UPDATE {table} AS held
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
    k VARBINARY(256) PATH '$.k',
    l CHAR(32) CHARACTER SET ascii PATH '$.l',
    t BIGINT PATH '$.t')) AS batch
    ON held.lock_key = batch.k AND held.lease_id = batch.l
SET held.expires_at = GREATEST(held.expires_at, {clock} + batch.t)
WHERE held.expires_at > {now}
