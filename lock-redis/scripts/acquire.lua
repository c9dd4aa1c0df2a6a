-- Single-node acquire: one atomic step that grants, re-grants to the same lease, or refuses.
-- Sent after token.lua and grant.lua, whose functions it calls.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash slot)
-- ARGV[1] lease id (hex), ARGV[2] TTL in milliseconds, ARGV[3] holder label (hex, '' for
-- none), kept after the entry's stamp
-- Returns the fencing token (> 0) when granted, 0 when another live lease holds the key.
local holder = holder_of(KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
return grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
