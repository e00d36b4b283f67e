-- Step 4: if the lease is still ours, record the token beside it with the
-- same expiry and return the remaining ttl in ms; -1 if the lease was lost
-- while the token was being taken.
-- KEYS[1] lease key, KEYS[2] token key; ARGV[1] lease id, ARGV[2] token.
-- A lease's token never changes: a second confirm with the same token (a
-- retry) succeeds, with another token it fails.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then return -1 end
local tok = redis.call('GET', KEYS[2])
if tok and tok ~= ARGV[2] then return -1 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', pttl)
return pttl
