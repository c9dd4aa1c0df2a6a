-- The next fencing token of a key, prepended by the Rust code to every script that grants
-- (grant.lua for acquire.lua and acquire_all.lua; shared_acquire.lua).
-- The token is the counter plus one, or the server's clock in microseconds since the
-- epoch if that is more: a hybrid of a counter and a clock. A counter that is missing (a
-- key never locked, or a server restarted without persistence) or behind (a replica
-- promoted before it got the last increments) is overtaken by the clock, so tokens keep
-- increasing across both, as long as no server's clock is behind an earlier primary's
-- by more than the failover took and the key averaged under a million grants a second
-- (docs.md). Lua numbers are doubles, exact for integers below 2^53 (in microseconds,
-- the year 2255). The counter is stored back, so the next grant sees this one.
local function next_token(counter_key)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = math.max(tonumber(redis.call('GET', counter_key) or '0') + 1, clock)
  redis.call('SET', counter_key, string.format('%.0f', token))
  return token
end

