-- Extends a lease only if it is still the live holder.
-- KEYS[1] lock key; ARGV[1] lease id, ARGV[2] TTL in milliseconds. Returns 1 or 0.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(%x+):') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
