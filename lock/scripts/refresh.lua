-- Extend the lease and its token to ARGV[2] ms if ARGV[1] still holds it.
-- KEYS[1] lease key, KEYS[2] token key. Returns 1, or 0 if not held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
