-- DDL is transactional in PostgreSQL; the advisory lock makes concurrent first starts
-- wait for each other instead of racing on the catalog.
BEGIN;
-- statement
SELECT pg_advisory_xact_lock(4923011187462310519);
-- statement
-- The fencing counter outlives every lock row: rows are deleted on release, and nextval
-- is never rolled back and after a crash only jumps forward.
CREATE SEQUENCE IF NOT EXISTS {table}_tokens AS bigint;
-- statement
CREATE TABLE IF NOT EXISTS {table} (
    lock_key   text   NOT NULL PRIMARY KEY,
    lease_id   text   NOT NULL,
    token      bigint NOT NULL,
    expires_at bigint NOT NULL,
    holder     text
);
-- statement
-- The holder's label, added to a table made before it existed. Looked up first: ALTER
-- TABLE would take the table's exclusive lock on every connect, waiting behind the live
-- lock calls and holding up new ones.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = '{table}'::regclass AND attname = 'holder'
                     AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN holder text;
    END IF;
END
$$;
-- statement
-- Idempotency records, one per key, beside the lock rows (write_record.sql).
CREATE TABLE IF NOT EXISTS {table}_records (
    record_key  text   NOT NULL PRIMARY KEY,
    value       bytea  NOT NULL,
    fingerprint bytea,
    token       bigint NOT NULL,
    expires_at  bigint NOT NULL
);
-- statement
CREATE INDEX IF NOT EXISTS {table}_records_expiry ON {table}_records (expires_at);
-- statement
-- Semaphores and reader-writer locks (holds/*.sql): one row per lease of a key in its
-- primitive ('semaphore' or 'rwlock'), kind 'permit', 'read', 'write' or 'intent' (a
-- waiting writer's), permits the semaphore's limit (0 for a reader-writer lock). Tokens
-- come from the lock table's sequence.
CREATE TABLE IF NOT EXISTS {table}_holds (
    hold_key   text   NOT NULL,
    primitive  text   NOT NULL,
    lease_id   text   NOT NULL,
    kind       text   NOT NULL,
    permits    bigint NOT NULL,
    token      bigint NOT NULL,
    expires_at bigint NOT NULL,
    holder     text,
    PRIMARY KEY (hold_key, primitive, lease_id)
);
-- statement
CREATE INDEX IF NOT EXISTS {table}_holds_expiry ON {table}_holds (expires_at);
-- statement
COMMIT;
