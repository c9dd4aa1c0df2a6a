-- The single-node grant, shared by acquire.lua (one key) and acquire_all.lua (a lock set):
-- each of those scripts is sent as token.lua, this text, and its own.

-- The lease id and token of the live entry under lock_key; nil when the key is free.
local function holder_of(lock_key)
  local held = redis.call('GET', lock_key)
  if held then
    return string.match(held, '^(%x+):(%d+):')
  end
  return nil
end

-- Grants lock_key to lease for ttl milliseconds, labelled label (hex, '' for none), and
-- returns its fencing token. The caller has checked that the key is free or the lease's
-- own: a retry whose reply was lost gets the same token, its TTL started again.
local function grant(lock_key, fence_key, lease, ttl, label)
  local holder, held_token = holder_of(lock_key)
  if holder == lease then
    redis.call('PEXPIRE', lock_key, ttl)
    return tonumber(held_token)
  end
  local token = next_token(fence_key)
  local suffix = ''
  if label ~= '' then
    suffix = ':' .. label
  end
  redis.call('SET', lock_key, lease .. ':' .. string.format('%.0f', token) .. ':0' .. suffix,
    'PX', ttl)
  return token
end

