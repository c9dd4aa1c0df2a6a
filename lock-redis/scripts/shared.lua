-- Helpers of the scripts that touch shared holds (semaphores, reader-writer locks),
-- prepended to each by the Rust code.
-- A shared key's holders are a hash (lease id -> '<kind>:<token>:<limit>:<label hex>') and
-- a sorted set (lease id -> expiry in the server's milliseconds) kept in step; its waiting
-- writers' intents are a sorted set of the same kind. Redis expires keys, not members, so
-- each member is live while its expiry is ahead of the server's clock, and each key is
-- set to expire with its last member: holders that all vanished (crashed clients) leave
-- nothing behind, whether or not anyone touches the key again.

-- The server's clock in milliseconds since the epoch, read once per script (and only by
-- scripts that need it).
local clock_ms
local function now()
  if not clock_ms then
    local time = redis.call('TIME')
    clock_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return clock_ms
end

-- A number as Redis takes it: Lua would print a large one with an exponent.
local function int(n)
  return string.format('%.0f', n)
end

-- Drops the members of `expiries` whose time has come, and their fields of `entries`
-- when given.
local function purge(expiries, entries)
  local gone = redis.call('ZRANGEBYSCORE', expiries, '-inf', int(now()))
  if #gone == 0 then
    return
  end
  if entries then
    for _, lease in ipairs(gone) do
      redis.call('HDEL', entries, lease)
    end
  end
  redis.call('ZREMRANGEBYSCORE', expiries, '-inf', int(now()))
end

-- Sets `expiries` (and `entries` when given) to expire with the last member of
-- `expiries`. An emptied key is gone already (Redis deletes empty hashes and sets).
local function expire_with_last(expiries, entries)
  local last = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')[2]
  if last then
    last = int(tonumber(last))
    redis.call('PEXPIREAT', expiries, last)
    if entries then
      redis.call('PEXPIREAT', entries, last)
    end
  end
end

