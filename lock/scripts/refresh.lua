-- Extend the lease and its token to ARGV[2] ms if ARGV[1] still holds it
-- and its token was confirmed. KEYS: 1 lease, 2 token (hash), and a
-- Redlock node's 3 <prefix>horizon (acquire.lua). ARGV[3] is
-- the refresh's sequence number, 0 for none (unordered: applied, not
-- recorded).
-- Returns the token, false if not held (a lease with no token is not
-- extended, as its acquisition did not finish), or -1 if a refresh with a
-- higher sequence number was applied first: this one arrived late and
-- must not undo it (docs/design.md, defect 102).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local h = redis.call('HMGET', KEYS[2], 't', 'c', 'q')
local tok = h[1]
if not tok then return false end
local ttl = tonumber(ARGV[2])
local seq = tonumber(ARGV[3])
local last = tonumber(h[3] or '0')
if tonumber(h[2] or '1') > 1 then
  -- While a reentrant holder holds it more than once, one hold's refresh
  -- never shortens the lease under the others (defect 19): applied late,
  -- it cannot undo a later one either.
  ttl = math.max(ttl, redis.call('PTTL', KEYS[1]))
elseif seq > 0 and seq < last then
  return -1
end
if seq > last then redis.call('HSET', KEYS[2], 'q', ARGV[3]) end
-- A Redlock node's horizon (KEYS[3], see acquire.lua) outlives the lease.
if KEYS[3] and redis.call('PTTL', KEYS[3]) < ttl then
  redis.call('SET', KEYS[3], '1', 'PX', ttl + math.floor(ttl / 8))
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return tok
