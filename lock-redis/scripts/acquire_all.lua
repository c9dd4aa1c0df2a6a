-- Single-node lock set: one atomic step that grants every key of a set, each as
-- acquire.lua would alone, or none. Sent after token.lua and grant.lua, whose functions it calls.
-- KEYS: for each key of the set in turn, its lock key and its fencing counter
-- ARGV: for each key in turn, the lease id (hex), the TTL in milliseconds and the holder
-- label (hex, '' for none)
-- Returns the tokens in the set's order when granted; an empty array, having changed
-- nothing, when another live lease holds any of the keys.
-- The keys of a set may lie in different hash slots: a standalone server does not mind (a
-- Redis Cluster, which this backend does not support, would refuse the script).
local count = #KEYS / 2
-- Every key is checked before any is written, so a refusal changes nothing.
local claimed = {}
for i = 1, count do
  local lock_key, lease = KEYS[2 * i - 1], ARGV[3 * i - 2]
  local holder = holder_of(lock_key)
  if holder and holder ~= lease then
    return {}
  end
  -- One key twice in a set, for two leases: the second could never be granted.
  if claimed[lock_key] and claimed[lock_key] ~= lease then
    return {}
  end
  claimed[lock_key] = lease
end
local tokens = {}
for i = 1, count do
  tokens[i] = grant(KEYS[2 * i - 1], KEYS[2 * i], ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i])
end
return tokens
