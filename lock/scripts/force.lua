-- Force-release (an operator's DELETE): delete the lease whoever holds it
-- and wake the queue's head. KEYS: 1 lease, 2 token (hash), 3 last,
-- 4 queue, 5 places. ARGV: 1 the release channel, 2 a nonce drawn for
-- this call, 3 the token the holder must have ('' for any holder).
-- Returns {lease id, token} of the holder it removed, {false, false} when
-- nobody held it, or, with ARGV[3], {false, token} when a grant with
-- another token ('0' if not recorded yet) holds it: nothing removed.
-- Safe to run twice: go-redis sends it again after a lost reply, and by
-- then the lock may have gone to the next waiter, whom nobody asked to
-- remove. The record this call left says what it removed.
local mark = 'forced:' .. ARGV[2] .. ':'
local last = redis.call('GET', KEYS[3])
if last and string.sub(last, 1, #mark) == mark then
  local rec = string.sub(last, #mark + 1)
  local sp = string.find(rec, ' ', 1, true)
  return {string.sub(rec, 1, sp - 1), string.sub(rec, sp + 1)}
end
local id = redis.call('GET', KEYS[1])
if not id then return {false, false} end
local tok = redis.call('HGET', KEYS[2], 't')
-- Conditional (DELETE ?token=N): safe to send again as a new request too,
-- since the next holder's token differs.
if ARGV[3] ~= '' and tok ~= ARGV[3] then return {false, tok or '0'} end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
-- The record keeps the last token for Inspect (which reads it after the
-- first space), marked so that the removed holder's release never reads
-- it as its own (it did not release), and with this call's nonce.
redis.call('SET', KEYS[3], mark .. id .. ' ' .. (tok or '0'), 'PX', math.max(pttl, 1))
publish_head(KEYS[4], KEYS[5], ARGV[1])
return {id, tok}
