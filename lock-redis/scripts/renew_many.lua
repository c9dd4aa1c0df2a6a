-- Renews many leases of one client in one step (batched renewal, single node), mutex
-- entries and shared holds alike (shared.lua comes first).
-- ARGV[3i-2] the i-th lease id, ARGV[3i-1] its TTL in milliseconds, ARGV[3i] its shape:
-- 'm' for a mutex entry, which takes one key (its lock key), 's' for a shared hold, which
-- takes two (the holders hash and their expiries); KEYS lists them in the same order.
-- Returns one 1 (renewed) or 0 (not the live holder) per lease, in order.
local renewed = {}
local next_key = 1
for i = 1, #ARGV / 3 do
  local lease, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1]
  renewed[i] = 0
  if ARGV[3 * i] == 'm' then
    local key = KEYS[next_key]
    next_key = next_key + 1
    local held = redis.call('GET', key)
    if held and string.match(held, '^(%x+):') == lease then
      redis.call('PEXPIRE', key, ttl)
      renewed[i] = 1
    end
  else
    local entries, expiries = KEYS[next_key], KEYS[next_key + 1]
    next_key = next_key + 2
    local expiry = redis.call('ZSCORE', expiries, lease)
    if expiry and tonumber(expiry) > now() and redis.call('HEXISTS', entries, lease) == 1 then
      -- Sets the expiry exactly, sooner or later (expire_in), as PEXPIRE does.
      redis.call('ZADD', expiries, int(now() + tonumber(ttl)), lease)
      expire_with_last(expiries, entries)
      renewed[i] = 1
    end
  end
end
return renewed
