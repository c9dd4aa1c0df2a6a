-- Stores an idempotency record only while the lease holds the key, in one step: a lease
-- that expired (by this server's clock), was released or was replaced writes nothing.
-- KEYS[1] lock key, KEYS[2] record key (same hash slot)
-- ARGV[1] lease id (hex), ARGV[2] the record's bytes, ARGV[3] retention in milliseconds
-- Returns 1 when written, 0 when the lease does not hold the key.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(%x+):') == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
