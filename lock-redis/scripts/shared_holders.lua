-- Every live holder of a shared key, read in one step (shared.lua comes first).
-- KEYS[1] holders hash, KEYS[2] their expiries
-- Returns one {lease id, entry, remaining milliseconds} per holder, in no particular
-- order.
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. int(now()), '+inf', 'WITHSCORES')
local found = {}
for i = 1, #live, 2 do
  local entry = redis.call('HGET', KEYS[1], live[i])
  if entry then
    found[#found + 1] = {live[i], entry, tonumber(live[i + 1]) - now()}
  end
end
return found
