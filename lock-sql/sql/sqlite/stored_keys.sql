-- Keys with a lock row or a shared-hold row (holds, writer intents), each once.
SELECT lock_key FROM {table} WHERE instr(lock_key, ?1) = 1
UNION
SELECT hold_key FROM {table}_holds WHERE instr(hold_key, ?1) = 1
