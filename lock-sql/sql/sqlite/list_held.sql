-- Live leases whose key starts with ?1, in key order. A range, not LIKE (whose wildcards
-- and ASCII case folding would widen the prefix): ?2 is the least text above every key
-- with the prefix, NULL when there is none; BINARY collation orders as Rust's str does.
SELECT lock_key, lease_id, token, expires_at - {now} AS remaining_ms, holder
FROM {table}
WHERE lock_key >= ?1 AND (?2 IS NULL OR lock_key < ?2) AND expires_at > {now}
ORDER BY lock_key
LIMIT ?3
