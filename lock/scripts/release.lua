-- Delete the lease and its token if ARGV[1] holds it, and tell waiters on
-- channel ARGV[2]. KEYS[1] lease key, KEYS[2] token key. Returns 1, or 0 if
-- not held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
