-- Extend the lease and its token to ARGV[2] ms if ARGV[1] still holds it.
-- KEYS[1] lease key, KEYS[2] token key. Returns the token, or false if not
-- held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return redis.call('GET', KEYS[2])
