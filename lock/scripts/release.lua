-- Delete the lease and its token if ARGV[1] holds it, and tell waiters on
-- channel ARGV[2]. KEYS[1] lease key, KEYS[2] token key, KEYS[3] the
-- released marker. Returns 1, or 0 if not held.
-- Safe to run twice: the marker remembers the released lease id for as
-- long as the lease had left, so a retry after a lost reply is a success,
-- not "lost" (docs/design.md, defect 4). No key outlives its lease.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('DEL', KEYS[1], KEYS[2])
  if pttl > 0 then redis.call('SET', KEYS[3], ARGV[1], 'PX', pttl) end
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return 1
end
if redis.call('GET', KEYS[3]) == ARGV[1] then return 1 end
return 0
