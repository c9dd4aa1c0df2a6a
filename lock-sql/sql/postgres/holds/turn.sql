-- First step of a shared acquire: acquirers of one (key, primitive) take turns on a
-- transaction-scoped advisory lock (named apart from the mutex's, '{table}/' || key), so
-- two of them never both count the holders before either writes, and a token is drawn
-- only by the acquirer whose turn it is and committed before the next one draws. The
-- innermost subquery, evaluated first, bounds every lock wait of this transaction to one
-- second (55P03: nothing is written and the backend answers "held by another").
SELECT pg_advisory_xact_lock(hashtextextended('{table}_holds/' || $2 || '/' || $1, 0))::text
FROM (SELECT set_config('lock_timeout', '1s', true) OFFSET 0) AS bounded
