-- What durable fencing tokens rest on: every grant's commit is flushed before it is
-- acknowledged, and the token sequence hands out values in order across connections.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       seqcache AS cache_size, seqincrement AS increment, seqcycle AS cycles
FROM pg_sequence WHERE seqrelid = '{table}_tokens'::regclass
