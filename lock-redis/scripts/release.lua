-- Deletes a lease only if it is still the live holder, then tells waiters.
-- KEYS[1] lock key; ARGV[1] lease id, ARGV[2] release channel. Returns 1 or 0.
-- The message names the lease too, so a client that hears one release from several
-- Redlock nodes can tell it is one release.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(%x+):') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- pcall: a user whose ACL denies the channel has still released the lock (scripts do not
  -- roll back), and must hear so; its waiters fall back to polling.
  redis.pcall('PUBLISH', ARGV[2], KEYS[1] .. '\n' .. ARGV[1])
  return 1
end
return 0
