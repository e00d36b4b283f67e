-- Extend the lease and its token to ARGV[2] ms if ARGV[1] still holds it
-- and its token was confirmed. KEYS: 1 lease, 2 token (hash).
-- Returns the token, or false if not held: a lease with no token is not
-- extended, as its acquisition did not finish.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local tok = redis.call('HGET', KEYS[2], 't')
if not tok then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return tok
