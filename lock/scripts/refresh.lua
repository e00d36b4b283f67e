-- Extend the lease and its token to ARGV[2] ms if ARGV[1] still holds it
-- and its token was confirmed. KEYS: 1 lease, 2 token (hash), and a
-- Redlock node's 3 <prefix>horizon and 4 <prefix>epoch (acquire.lua).
-- ARGV[3] is the refresh's sequence number, 0 for none (unordered:
-- applied, not recorded).
-- Returns the token, false if not held (a lease with no token is not
-- extended, as its acquisition did not finish), or -1 if a refresh with a
-- higher sequence number was applied first: this one arrived late and
-- must not undo it (docs/design.md, defect 102).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
-- A Redlock node that does not vote yet (acquire.lua: no epoch, one of
-- another server process, or its time not come) vouches for no lease
-- either: one restored from a snapshot or a lagging replica may have been
-- released or force-released since, and taken by another holder on a
-- majority with this node; extended here, it would be on a majority again
-- beside that holder's. Not held, as after a restart without persistence.
if KEYS[4] then
  local from, run = string.match(redis.call('GET', KEYS[4]) or '', '^(%d+) (%x+)$')
  local t = redis.call('TIME')
  if run ~= string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
    or tonumber(from) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return false
  end
end
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
