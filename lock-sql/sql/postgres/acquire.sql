-- Acquires of one key take turns on a transaction-scoped advisory lock before anything
-- else, so a token is drawn only by the acquire whose turn it is and committed before the
-- next one draws: tokens follow grant order even when a statement stalls between drawing
-- its token and inserting its row. A takeover draws its token again under the row lock,
-- which keeps that order against any writer that bypasses the turn.
-- Whether the old lease is over is judged once, at the statement's start ({now}); the
-- expiry written counts from the moment of writing ({clock}), so a grant that waited for
-- the row lock is not born expired. A grant of the caller's own lease (a retried request)
-- never shortens the expiry a later attempt already wrote. The holder label ($4, NULL for
-- none) is the granted lease's.
-- A contended acquire waits at most one second for the key's turn or row, which other
-- statements hold only while they write: the innermost subquery, evaluated first, sets
-- lock_timeout for this statement's own (autocommit) transaction, so a lock wait past it
-- fails (55P03, nothing written) and the backend answers "held by another" instead of
-- spending the request time-out waiting behind a stalled writer.
INSERT INTO {table} AS held (lock_key, lease_id, token, expires_at, holder)
SELECT $1, $2, nextval('{table}_tokens'), {clock} + $3, $4
FROM (SELECT pg_advisory_xact_lock(hashtextextended('{table}/' || $1, 0))
      FROM (SELECT set_config('lock_timeout', '1s', true) OFFSET 0) AS bounded
      OFFSET 0) AS turn
ON CONFLICT (lock_key) DO UPDATE SET
    token = CASE WHEN held.expires_at > {now} THEN held.token
                 ELSE nextval('{table}_tokens') END,
    lease_id = EXCLUDED.lease_id,
    holder = EXCLUDED.holder,
    expires_at = GREATEST(
        CASE WHEN held.lease_id = EXCLUDED.lease_id THEN held.expires_at ELSE 0 END,
        {clock} + $3)
WHERE held.expires_at <= {now} OR held.lease_id = EXCLUDED.lease_id
RETURNING lease_id, token, expires_at - {clock} AS remaining_ms
