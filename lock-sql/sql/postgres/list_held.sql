-- Live leases whose key starts with $1, in key order. A range, not LIKE (whose wildcards
-- would widen the prefix): $2 is the least text above every key with the prefix, NULL
-- when there is none. Compared and ordered in the "C" collation, byte for byte as Rust's
-- str: a language collation would order, and so bound, keys differently.
SELECT lock_key, lease_id, token, expires_at - {now} AS remaining_ms, holder
FROM {table}
WHERE lock_key COLLATE "C" >= $1
  AND ($2::text IS NULL OR lock_key COLLATE "C" < $2)
  AND expires_at > {now}
ORDER BY lock_key COLLATE "C"
LIMIT $3
