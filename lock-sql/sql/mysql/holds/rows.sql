-- Every entry of the key left by clear.sql (all live): holds and writer intents. A locking
-- read, so it sees the latest committed rows whatever the isolation level.
SET STATEMENT innodb_lock_wait_timeout = 1 FOR
SELECT lease_id, kind, permits, token FROM {table}_holds
WHERE hold_key = ? AND primitive = ?
LOCK IN SHARE MODE
