-- Step 2 of the acquisition protocol: take the lease if it is free.
-- KEYS[1] lease key; ARGV[1] lease id; ARGV[2] ttl in ms.
-- Returns -1 when taken, else the holder's remaining ttl in ms (0 if unknown).
-- Safe to run twice: a client library that retries after a lost reply
-- finds its own lease id and is told it has the lease (docs/design.md,
-- defect 4), rather than leaving an orphan that blocks a free lock.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return -1
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return 0 end
return pttl
