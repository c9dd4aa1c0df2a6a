-- Redlock round 2 on one node: record the chosen token in the entry taken in round 1 and
-- raise the node's counter to it, so any later majority sees it.
-- KEYS[1] lock key, KEYS[2] fencing counter
-- ARGV[1] lease id, ARGV[2] the attempt's stamp (as round 1 wrote it), ARGV[3] token
-- Returns 1 when recorded, 0 when that entry is gone (expired, released, replaced, or
-- claimed by a later attempt of the lease).
local held = redis.call('GET', KEYS[1])
if not held then
  return 0
end
-- The holder label (hex), if any, follows the stamp and is kept.
local lease, token, stamp, label = string.match(held, '^(%x+):(%d+):(%w+):?(%x*)$')
if lease ~= ARGV[1] or stamp ~= ARGV[2] then
  return 0
end
-- Tokens in an entry and in the counter only ever grow, whatever order rounds arrive in.
local chosen = math.max(tonumber(token), tonumber(ARGV[3]))
local text = string.format('%.0f', chosen)
if label ~= '' then
  label = ':' .. label
end
redis.call('SET', KEYS[1], lease .. ':' .. text .. ':' .. stamp .. label, 'KEEPTTL')
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if counter < chosen then
  redis.call('SET', KEYS[2], text)
end
return 1
