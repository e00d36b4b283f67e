-- Take off a reentry its caller never learnt of: the reply was lost and
-- the call failed (its deadline passed before go-redis sent it again, or
-- go-redis's retries ran out), but the acquire script had counted it.
-- Without this the holder's last release left the lock held, by nobody,
-- until its TTL. KEYS: 1 token (hash); for ARGV[2] '1' also 2 lease.
-- ARGV: 1 the reentry's op (see acquire.lua: 'w' .. its waiter, or its
-- attempt's lease id); 2 '1' to take it off only if no copy of the request
-- was handed it (acquire.lua's 'h' mark) and the lease is still ARGV[3]'s:
-- a server whose client went away (docs/design.md, defect 183); 3 the
-- lease id then.
-- Returns 1 when a hold was taken off. Safe to run twice: the op goes with
-- the hold, so a second run finds nothing, and an acquisition that tries
-- again with the same waiter counts its hold anew.
-- Never a hold a copy of the request was handed ('h' mark), in either
-- mode: that copy's caller has it (a client that gave up on one fenced
-- server and asked another), and taking it off left the holder one
-- release short, its lock freed under its outer hold (docs/design.md,
-- defect 214). If the copy's answer was lost too, the hold stays until
-- the lock's TTL: a lock held by nobody a while, rather than two holders.
if ARGV[2] == '1' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
local h = redis.call('HMGET', KEYS[1], 'c', 'ops')
if not seen(h[2], ARGV[1]) then return 0 end
if seen(h[2], 'h' .. ARGV[1]) then return 0 end
-- The last hold is its holder's to release (a reentry always counts a
-- second one).
if tonumber(h[1] or '1') <= 1 then return 0 end
local ops = h[2]
for _, op in ipairs({ARGV[1], 'h' .. ARGV[1]}) do
  local mark = ' ' .. op .. ' '
  local at = string.find(ops, mark, 1, true)
  if at then ops = string.sub(ops, 1, at - 1) .. string.sub(ops, at + #mark) end
end
redis.call('HSET', KEYS[1], 'ops', ops)
redis.call('HINCRBY', KEYS[1], 'c', -1)
return 1
