-- Acquire of a shared hold (a semaphore permit, a read or a write of a reader-writer lock)
-- in one atomic step: grants, re-grants to the same lease, or refuses (shared.lua and
-- token.lua come first).
-- KEYS[1] holders hash, KEYS[2] their expiries, KEYS[3] waiting writers' intents,
-- KEYS[4] fencing counter (all under the key's one hash tag)
-- ARGV[1] lease id (hex), ARGV[2] TTL in milliseconds, ARGV[3] kind ('permit', 'read',
-- 'write'), ARGV[4] the semaphore's limit (0 for a reader-writer lock), ARGV[5] holder
-- label (hex, '' for none), ARGV[6] '1' when a refused write leaves its intent
-- Returns {1, token} when granted, {0, 0} when refused, {2, limit} when the semaphore's
-- holders asked with another limit (nothing is changed then).
local entries, expiries, intents = KEYS[1], KEYS[2], KEYS[3]
local lease, kind, limit = ARGV[1], ARGV[3], tonumber(ARGV[4])
local expiry = int(now() + tonumber(ARGV[2]))
purge(expiries, entries)
purge(intents)
local own = redis.call('HGET', entries, lease)
if own then
  -- A retry whose reply was lost: same lease, same token, TTL starts again.
  redis.call('ZADD', expiries, expiry, lease)
  expire_with_last(expiries, entries)
  return {1, tonumber(string.match(own, '^%a+:(%d+):'))}
end
local held = redis.call('ZCARD', expiries)
-- Every holder agrees on the semaphore's limit, and a writer holds alone: any one holder
-- tells what the others are.
local one = nil
if held > 0 then
  one = redis.call('HGET', entries, redis.call('ZRANGE', expiries, 0, 0)[1])
end
local granted
if kind == 'permit' then
  local theirs = one and tonumber(string.match(one, '^%a+:%d+:(%d+):'))
  if theirs and theirs ~= limit then
    return {2, theirs}
  end
  granted = held < limit
elseif kind == 'read' then
  granted = not (one and string.match(one, '^write:')) and redis.call('ZCARD', intents) == 0
else
  granted = held == 0
end
if not granted then
  if kind == 'write' and ARGV[6] == '1' then
    -- Readers that come after this writer wait behind it (writer preference): Redis
    -- keeps no queue, so without it overlapping readers could starve it.
    redis.call('ZADD', intents, expiry, lease)
    expire_with_last(intents)
  end
  return {0, 0}
end
local token = next_token(KEYS[4])
redis.call('HSET', entries, lease, kind .. ':' .. int(token) .. ':' .. ARGV[4] .. ':' .. ARGV[5])
redis.call('ZADD', expiries, expiry, lease)
expire_with_last(expiries, entries)
if redis.call('ZREM', intents, lease) == 1 then
  expire_with_last(intents)
end
return {1, token}
