-- Redlock round 1 on one node: take the key for a lease (token still pending), or claim
-- the lease's own entry for this attempt, and report the node's fencing counter.
-- KEYS[1] lock key, KEYS[2] fencing counter
-- ARGV[1] lease id, ARGV[2] TTL in milliseconds, ARGV[3] the attempt's stamp, ARGV[4] the
-- holder label (hex, '' for none), kept after the stamp
-- Returns {status, token of the entry (0 = pending), counter};
-- status 0 = held by another lease (or claimed by a later attempt of this one),
-- 1 = newly taken, 2 = already this lease's.
-- Stamps grow with each attempt of a lease, so the entry always carries the latest
-- attempt's stamp: a late confirm or clean-up of an earlier attempt finds a higher stamp
-- and leaves the entry alone, and a late reserve of an earlier attempt cannot claim it back.
-- A missing counter (a key never locked here, or a node restarted without persistence)
-- starts at the node's clock in microseconds since the epoch, so a majority of restarted
-- nodes still picks a token above those handed out before (docs.md, clock assumption).
local counter = tonumber(redis.call('GET', KEYS[2]) or '-1')
if counter < 0 then
  local now = redis.call('TIME')
  counter = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%.0f', counter))
end
local label = ''
if ARGV[4] ~= '' then
  label = ':' .. ARGV[4]
end
local held = redis.call('GET', KEYS[1])
if held then
  local lease, token, stamp = string.match(held, '^(%x+):(%d+):(%w+)')
  if lease ~= ARGV[1] or (tonumber(stamp) or 0) > tonumber(ARGV[3]) then
    return {0, 0, counter}
  end
  redis.call('SET', KEYS[1], lease .. ':' .. token .. ':' .. ARGV[3] .. label, 'PX', ARGV[2])
  return {2, tonumber(token), counter}
end
redis.call('SET', KEYS[1], ARGV[1] .. ':0:' .. ARGV[3] .. label, 'PX', ARGV[2])
return {1, 0, counter}
