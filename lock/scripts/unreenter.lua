-- Take off a reentry its caller never learnt of: the reply was lost and
-- the call failed (its deadline passed before go-redis sent it again, or
-- go-redis's retries ran out), but the acquire script had counted it.
-- Without this the holder's last release left the lock held, by nobody,
-- until its TTL. KEYS: 1 token (hash). ARGV: 1 the reentry's op (see
-- acquire.lua: 'w' .. its waiter, or its attempt's lease id).
-- Returns 1 when a hold was taken off. Safe to run twice: the op goes with
-- the hold, so a second run finds nothing, and an acquisition that tries
-- again with the same waiter counts its hold anew.
local h = redis.call('HMGET', KEYS[1], 'c', 'ops')
if not seen(h[2], ARGV[1]) then return 0 end
-- The last hold is its holder's to release (a reentry always counts a
-- second one).
if tonumber(h[1] or '1') <= 1 then return 0 end
local ops, mark = h[2], ' ' .. ARGV[1] .. ' '
local at = string.find(ops, mark, 1, true)
redis.call('HSET', KEYS[1], 'ops', string.sub(ops, 1, at - 1) .. string.sub(ops, at + #mark))
redis.call('HINCRBY', KEYS[1], 'c', -1)
return 1
