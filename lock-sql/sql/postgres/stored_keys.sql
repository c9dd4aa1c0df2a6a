-- Keys with a lock row or a shared-hold row (holds, writer intents), each once.
SELECT lock_key FROM {table} WHERE starts_with(lock_key, $1)
UNION
SELECT hold_key FROM {table}_holds WHERE starts_with(hold_key, $1)
