-- Live leases whose key starts with the first parameter, in key order. A range, not LIKE
-- (whose wildcards would widen the prefix): the second and third parameters are the least
-- text above every key with the prefix, NULL when there is none. The key column is
-- VARBINARY, so comparisons and order are byte for byte, as Rust's str orders; the
-- order is by the column, not by its converted copy (whose collation orders otherwise).
SELECT CONVERT(lock_key USING utf8mb4) AS held_key, lease_id, token,
       expires_at - {now} AS remaining_ms, holder
FROM {table}
WHERE lock_key >= ? AND (? IS NULL OR lock_key < ?) AND expires_at > {now}
ORDER BY {table}.lock_key
LIMIT ?
