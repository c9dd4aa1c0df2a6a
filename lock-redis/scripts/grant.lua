-- The single-node grant, shared by acquire.lua (one key) and acquire_all.lua (a lock set):
-- each of those scripts is sent as this text followed by its own.

-- The lease id and token of the live entry under lock_key; nil when the key is free.
local function holder_of(lock_key)
  local held = redis.call('GET', lock_key)
  if held then
    return string.match(held, '^(%x+):(%d+):')
  end
  return nil
end

-- Grants lock_key to lease for ttl milliseconds, labelled label (hex, '' for none), and
-- returns its fencing token. The caller has checked that the key is free or the lease's
-- own: a retry whose reply was lost gets the same token, its TTL started again.
local function grant(lock_key, fence_key, lease, ttl, label)
  local holder, held_token = holder_of(lock_key)
  if holder == lease then
    redis.call('PEXPIRE', lock_key, ttl)
    return tonumber(held_token)
  end
  -- The token is the counter plus one, or the server's clock in microseconds since the
  -- epoch if that is more: a hybrid of a counter and a clock. A counter that is missing (a
  -- key never locked, or a server restarted without persistence) or behind (a replica
  -- promoted before it got the last increments) is overtaken by the clock, so tokens keep
  -- increasing across both, as long as no server's clock is behind an earlier primary's
  -- by more than the failover took and the key averaged under a million grants a second
  -- (docs.md). Lua numbers are doubles, exact for integers below 2^53 (in microseconds,
  -- the year 2255).
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = math.max(tonumber(redis.call('GET', fence_key) or '0') + 1, clock)
  redis.call('SET', fence_key, string.format('%.0f', token))
  local suffix = ''
  if label ~= '' then
    suffix = ':' .. label
  end
  redis.call('SET', lock_key, lease .. ':' .. string.format('%.0f', token) .. ':0' .. suffix,
    'PX', ttl)
  return token
end

