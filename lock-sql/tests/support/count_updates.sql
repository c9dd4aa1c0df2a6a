-- Counts the UPDATE statements on the default lock table (however many rows each
-- touches) in distlock_test_updates.n. Idempotent: run before every reading.
CREATE TABLE IF NOT EXISTS distlock_test_updates (n bigint NOT NULL);
INSERT INTO distlock_test_updates SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM distlock_test_updates);
CREATE OR REPLACE FUNCTION distlock_test_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE distlock_test_updates SET n = n + 1;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER distlock_test_count_update AFTER UPDATE ON distlock_locks
    FOR EACH STATEMENT EXECUTE FUNCTION distlock_test_count_update();
