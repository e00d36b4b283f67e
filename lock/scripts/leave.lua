-- A fair waiter gives up its place. KEYS: 1 queue, 2 places, 3 lease.
-- ARGV: 1 waiter, 2 the release channel. If it was the first waiter still
-- waiting, the next is woken rather than left to its next poll: to take
-- the lock if it is free, else to know that it is next (leave_queue).
-- Expired places are dropped first: the first waiter may stand behind
-- one, and the next may be one.
drop_expired(KEYS[1], KEYS[2], now_ms())
local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if head == ARGV[1] and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  publish_head(KEYS[1], KEYS[2], ARGV[2])
else
  leave_queue(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
return 1
