-- The key's expired holds and intents go, so every row rows.sql then reads is live. A
-- locking delete reads the latest rows: a renewal either lands first (and the row stays)
-- or finds the row gone.
SET STATEMENT innodb_lock_wait_timeout = 1 FOR
DELETE FROM {table}_holds WHERE hold_key = ? AND primitive = ? AND expires_at <= {now}
