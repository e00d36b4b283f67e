-- Step 4: if the lease is still ours, record its token (and owner and
-- holder) beside it with the same expiry and return the remaining ttl in
-- ms; -1 if the lease was lost while the token was being taken.
-- KEYS: 1 lease, 2 token (hash). ARGV: 1 lease id, 2 token, 3 owner,
-- 4 holder, 5 the id of a remote acquisition ('' for none), recorded
-- with the lease id (w) so that its next request finds this grant if its
-- answer is lost (see acquire.lua).
-- A lease's token never changes: a second confirm with the same token (a
-- retry) succeeds and changes nothing, with another token it fails.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then return -1 end
local tok = redis.call('HGET', KEYS[2], 't')
if tok and tok ~= ARGV[2] then return -1 end
-- Recorded already: this is the confirm sent again, and the hash may have
-- changed since (a reentry counted, defect 19): writing it anew would take
-- that hold off.
if tok then return pttl end
local w = ''
if ARGV[5] ~= '' then w = ARGV[1] .. ' ' .. ARGV[5] end
redis.call('HSET', KEYS[2], 't', ARGV[2], 'o', ARGV[3], 'h', ARGV[4], 'c', 1, 'w', w)
redis.call('PEXPIRE', KEYS[2], pttl)
return pttl
