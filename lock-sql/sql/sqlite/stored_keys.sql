SELECT lock_key FROM {table} WHERE instr(lock_key, ?1) = 1
