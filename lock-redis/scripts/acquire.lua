-- Single-node acquire: one atomic step that grants, re-grants to the same lease, or refuses.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash slot)
-- ARGV[1] lease id (hex), ARGV[2] TTL in milliseconds, ARGV[3] holder label (hex, '' for
-- none), kept after the entry's stamp
-- Returns the fencing token (> 0) when granted, 0 when another live lease holds the key.
local held = redis.call('GET', KEYS[1])
if held then
  local lease, token = string.match(held, '^(%x+):(%d+):')
  if lease == ARGV[1] then
    -- A retry whose reply was lost: same lease, same token, TTL starts again.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(token)
  end
  return 0
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
local token = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, clock)
redis.call('SET', KEYS[2], string.format('%.0f', token))
local label = ''
if ARGV[3] ~= '' then
  label = ':' .. ARGV[3]
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%.0f', token) .. ':0' .. label,
  'PX', ARGV[2])
return token
