-- Redlock clean-up after a failed acquisition attempt, on one node: deletes the lease's
-- entry unless a later attempt of the same lease has claimed it since, and tells no waiter
-- (nothing was ever held, so a wake-up would only start a herd of doomed attempts).
-- A clean-up may land long after it was sent (a retransmission behind a dropped
-- connection), when the lease's next attempt has already succeeded on this node; matching
-- the lease id alone would then delete a live grant.
-- KEYS[1] lock key; ARGV[1] lease id, ARGV[2] the failed attempt's stamp. Returns 1 or 0.
local held = redis.call('GET', KEYS[1])
if not held then
  return 0
end
local lease, stamp = string.match(held, '^(%x+):%d+:(%w+)')
if lease ~= ARGV[1] or (tonumber(stamp) or 0) > tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
