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
-- A counter that is missing (a key never locked, or a server restarted without
-- persistence, which forgets every counter) starts at the server's clock in microseconds
-- since the epoch: above every token handed out before the restart, as long as the clock
-- did not step back and the key averaged under a million grants a second (docs.md).
local token
if redis.call('EXISTS', KEYS[2]) == 1 then
  token = redis.call('INCR', KEYS[2])
else
  local now = redis.call('TIME')
  token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%.0f', token))
end
local label = ''
if ARGV[3] ~= '' then
  label = ':' .. ARGV[3]
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%.0f', token) .. ':0' .. label,
  'PX', ARGV[2])
return token
