-- A fair waiter gives up its place. KEYS: 1 queue, 2 places, 3 lease.
-- ARGV: 1 waiter, 2 the release channel. If it was at the head and the
-- lock is free, the next waiter is woken rather than left to its next
-- poll.
local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if head == ARGV[1] and redis.call('EXISTS', KEYS[3]) == 0 then
  local next = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if next then redis.call('PUBLISH', ARGV[2], next) end
end
return 1
