SELECT lock_key FROM {table} WHERE starts_with(lock_key, $1)
