-- Redlock round 1 on one node: take the key for a lease (token still pending), or refresh
-- the lease's own entry, and report the node's fencing counter.
-- KEYS[1] lock key, KEYS[2] fencing counter
-- ARGV[1] lease id, ARGV[2] TTL in milliseconds, ARGV[3] nonce for a new entry
-- Returns {status, token of the entry (0 = pending), counter, nonce of the entry};
-- status 0 = held by another lease, 1 = newly taken, 2 = already this lease's.
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
local held = redis.call('GET', KEYS[1])
if held then
  local lease, token, nonce = string.match(held, '^(%x+):(%d+):(%w+)$')
  if lease ~= ARGV[1] then
    return {0, 0, counter, ''}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, tonumber(token), counter, nonce}
end
redis.call('SET', KEYS[1], ARGV[1] .. ':0:' .. ARGV[3], 'PX', ARGV[2])
return {1, 0, counter, ARGV[3]}
