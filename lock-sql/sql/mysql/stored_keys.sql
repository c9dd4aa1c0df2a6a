-- Keys with a lock row or a shared-hold row (holds, writer intents), each once; the
-- prefix is bound twice. The union compares the binary keys, before their conversion.
SELECT CONVERT(stored_key USING utf8mb4) AS lock_key FROM (
    SELECT lock_key AS stored_key FROM {table} WHERE INSTR(lock_key, ?) = 1
    UNION
    SELECT hold_key FROM {table}_holds WHERE INSTR(hold_key, ?) = 1
) AS stored
