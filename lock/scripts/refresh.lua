-- Extend the lease and its token to ARGV[2] ms if ARGV[1] still holds it
-- and its token was confirmed. KEYS: 1 lease, 2 token (hash).
-- Returns the token, or false if not held: a lease with no token is not
-- extended, as its acquisition did not finish.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local h = redis.call('HMGET', KEYS[2], 't', 'c')
local tok = h[1]
if not tok then return false end
-- While a reentrant holder holds it more than once, one hold's refresh
-- never shortens the lease under the others (docs/design.md, defect 19).
local ttl = tonumber(ARGV[2])
if tonumber(h[2] or '1') > 1 then ttl = math.max(ttl, redis.call('PTTL', KEYS[1])) end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return tok
