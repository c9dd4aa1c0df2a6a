-- A named lock makes concurrent first starts create the schema one after the other.
DO GET_LOCK('distlock.migrate.{table}', 30);
-- statement
-- VARBINARY: keys compare byte for byte (no collation folds case, accents or spaces).
CREATE TABLE IF NOT EXISTS {table} (
    lock_key   VARBINARY(256) NOT NULL PRIMARY KEY,
    lease_id   CHAR(32) CHARACTER SET ascii NOT NULL,
    token      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    holder     TEXT CHARACTER SET utf8mb4 NULL
) ENGINE = InnoDB;
-- statement
-- The holder's label, added to a table made before it existed. Looked up first, so a
-- table that has it is not altered (ALTER TABLE waits for every open transaction on it).
BEGIN NOT ATOMIC
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_schema = DATABASE() AND table_name = '{table}'
                     AND column_name = 'holder') THEN
        ALTER TABLE {table} ADD COLUMN holder TEXT CHARACTER SET utf8mb4 NULL;
    END IF;
END;
-- statement
-- The fencing counter outlives every lock row: rows are deleted on release.
CREATE TABLE IF NOT EXISTS {table}_tokens (
    id         TINYINT NOT NULL PRIMARY KEY,
    last_token BIGINT NOT NULL
) ENGINE = InnoDB;
-- statement
INSERT IGNORE INTO {table}_tokens (id, last_token) VALUES (1, 0);
-- statement
-- Draws the next token inside the granting statement's transaction, so a grant and its
-- token commit together (InnoDB, fsynced at commit) or not at all.
CREATE TRIGGER IF NOT EXISTS {table}_token_granted BEFORE INSERT ON {table} FOR EACH ROW
BEGIN
    UPDATE {table}_tokens SET last_token = last_token + 1 WHERE id = 1;
    SET NEW.token = (SELECT last_token FROM {table}_tokens WHERE id = 1);
END;
-- statement
-- Idempotency records, one per key, beside the lock rows (write_record.sql); the key is
-- compared byte for byte like the lock table's.
CREATE TABLE IF NOT EXISTS {table}_records (
    record_key  VARBINARY(256) NOT NULL PRIMARY KEY,
    value       LONGBLOB NOT NULL,
    fingerprint BLOB,
    token       BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    INDEX {table}_records_expiry (expires_at)
) ENGINE = InnoDB;
-- statement
-- Semaphores and reader-writer locks (holds/*.sql): one row per lease of a key in its
-- primitive ('semaphore' or 'rwlock'), kind 'permit', 'read', 'write' or 'intent' (a
-- waiting writer's), permits the semaphore's limit (0 for a reader-writer lock). Tokens
-- come from the lock table's counter; the key compares byte for byte like the lock
-- table's.
CREATE TABLE IF NOT EXISTS {table}_holds (
    hold_key   VARBINARY(256) NOT NULL,
    primitive  VARCHAR(16) CHARACTER SET ascii NOT NULL,
    lease_id   CHAR(32) CHARACTER SET ascii NOT NULL,
    kind       VARCHAR(8) CHARACTER SET ascii NOT NULL,
    permits    BIGINT NOT NULL,
    token      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    holder     TEXT CHARACTER SET utf8mb4 NULL,
    PRIMARY KEY (hold_key, primitive, lease_id),
    INDEX {table}_holds_expiry (expires_at)
) ENGINE = InnoDB;
-- statement
DO RELEASE_LOCK('distlock.migrate.{table}');
