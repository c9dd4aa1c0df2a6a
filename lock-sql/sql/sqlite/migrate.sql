-- One write transaction, so processes that start together create the schema once.
BEGIN IMMEDIATE;
-- statement
CREATE TABLE IF NOT EXISTS {table} (
    lock_key   TEXT    NOT NULL PRIMARY KEY,
    lease_id   TEXT    NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    holder     TEXT
) WITHOUT ROWID;
-- statement if the column is missing
-- The holder's label, added to a table made before it existed (SQLite has no ADD COLUMN
-- IF NOT EXISTS: the backend ignores this statement's "duplicate column" error).
ALTER TABLE {table} ADD COLUMN holder TEXT;
-- statement
-- The fencing counter outlives every lock row: rows are deleted on release.
CREATE TABLE IF NOT EXISTS {table}_tokens (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    last_token INTEGER NOT NULL
);
-- statement
INSERT OR IGNORE INTO {table}_tokens (id, last_token) VALUES (1, 0);
-- statement
-- Advances the counter inside the granting statement itself, so a grant and its token
-- commit together or not at all.
CREATE TRIGGER IF NOT EXISTS {table}_token_granted AFTER INSERT ON {table} BEGIN
    UPDATE {table}_tokens SET last_token = NEW.token WHERE id = 1 AND last_token < NEW.token;
END;
-- statement
CREATE TRIGGER IF NOT EXISTS {table}_token_taken_over AFTER UPDATE OF token ON {table} BEGIN
    UPDATE {table}_tokens SET last_token = NEW.token WHERE id = 1 AND last_token < NEW.token;
END;
-- statement
-- Idempotency records, one per key, beside the lock rows (write_record.sql).
CREATE TABLE IF NOT EXISTS {table}_records (
    record_key  TEXT    NOT NULL PRIMARY KEY,
    value       BLOB    NOT NULL,
    fingerprint BLOB,
    token       INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;
-- statement
CREATE INDEX IF NOT EXISTS {table}_records_expiry ON {table}_records (expires_at);
-- statement
-- Semaphores and reader-writer locks (holds/*.sql): one row per lease of a key in its
-- primitive ('semaphore' or 'rwlock'), kind 'permit', 'read', 'write' or 'intent' (a
-- waiting writer's), permits the semaphore's limit (0 for a reader-writer lock). Tokens
-- come from the lock table's counter.
CREATE TABLE IF NOT EXISTS {table}_holds (
    hold_key   TEXT    NOT NULL,
    primitive  TEXT    NOT NULL,
    lease_id   TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    permits    INTEGER NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    holder     TEXT,
    PRIMARY KEY (hold_key, primitive, lease_id)
) WITHOUT ROWID;
-- statement
CREATE INDEX IF NOT EXISTS {table}_holds_expiry ON {table}_holds (expires_at);
-- statement
COMMIT;
