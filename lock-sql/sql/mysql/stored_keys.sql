SELECT CONVERT(lock_key USING utf8mb4) AS lock_key FROM {table} WHERE INSTR(lock_key, ?) = 1
