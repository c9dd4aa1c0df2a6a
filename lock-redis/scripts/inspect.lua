-- The holder and its remaining TTL, read in one step so they belong together.
-- KEYS[1] lock key. Returns {value or '', PTTL in milliseconds}.
local held = redis.call('GET', KEYS[1])
if not held then
  return {'', -2}
end
return {held, redis.call('PTTL', KEYS[1])}
