-- Force-release (an operator's DELETE): delete the lease whoever holds it
-- and wake the queue's head. KEYS: 1 lease, 2 token (hash), 3 last,
-- 4 queue, 5 places. ARGV: 1 the release channel.
-- Returns {lease id, token} of the holder it removed, or {false, false}.
local id = redis.call('GET', KEYS[1])
if not id then return {false, false} end
local tok = redis.call('HGET', KEYS[2], 't')
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
-- The record keeps the last token for Inspect, marked so that the removed
-- holder's release never reads it as its own (it did not release).
if pttl > 0 then redis.call('SET', KEYS[3], 'forced:' .. id .. ' ' .. (tok or '0'), 'PX', pttl) end
publish_head(KEYS[4], KEYS[5], ARGV[1])
return {id, tok}
