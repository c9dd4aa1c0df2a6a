-- Single-node acquire: one atomic step that grants, re-grants to the same lease, or refuses
-- (token.lua comes first: next_token).
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
local token = next_token(KEYS[2])
local label = ''
if ARGV[3] ~= '' then
  label = ':' .. ARGV[3]
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%.0f', token) .. ':0' .. label,
  'PX', ARGV[2])
return token
