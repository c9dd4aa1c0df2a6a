-- Deletes a lease only if it is still the live holder, then tells waiters.
-- KEYS[1] lock key; ARGV[1] lease id, ARGV[2] release channel. Returns 1 or 0.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(%x+):') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
return 0
