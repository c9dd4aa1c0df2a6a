-- Release of a shared hold: removes the lease's entry and its writer intent, if any, then
-- tells waiters (shared.lua comes first).
-- KEYS[1] holders hash, KEYS[2] their expiries, KEYS[3] waiting writers' intents
-- ARGV[1] lease id, ARGV[2] release channel
-- Returns 1 when the lease held the key, 0 otherwise (an intent alone, an expired entry,
-- which is deleted, or nothing).
local entries, expiries, intents, lease = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local expiry = redis.call('ZSCORE', expiries, lease)
local held = expiry ~= false and tonumber(expiry) > now()
redis.call('HDEL', entries, lease)
if redis.call('ZREM', expiries, lease) == 1 then
  expire_with_last(expiries, entries)
end
local intended = redis.call('ZREM', intents, lease) == 1
if intended then
  expire_with_last(intents)
end
-- A writer that gives up lets the readers it held back in: they are woken too.
if held or intended then
  -- pcall: see release.lua.
  redis.pcall('PUBLISH', ARGV[2], entries .. '\n' .. lease)
end
if held then
  return 1
end
return 0
