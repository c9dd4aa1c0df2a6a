-- Renews many leases of one client in one step (batched renewal, single node).
-- KEYS[i] lock key; ARGV[2i-1] its lease id, ARGV[2i] its TTL in milliseconds.
-- Returns one 1 (renewed) or 0 (not the live holder) per key, in order.
local renewed = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held and string.match(held, '^(%x+):') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
