-- READ COMMITTED for this one statement, and the expiry index, so the sweep locks only the
-- expired rows it deletes, not every row it reads and the gaps between them (REPEATABLE
-- READ would block acquires of unrelated keys until it commits).
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
-- statement
DELETE FROM {table} WHERE expires_at <= {now}
