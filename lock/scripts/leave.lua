-- A fair waiter gives up its place. KEYS: 1 queue, 2 places, 3 lease.
-- ARGV: 1 waiter, 2 the release channel. If it was the first waiter still
-- waiting and the lock is free, the next is woken rather than left to its
-- next poll. Expired places are dropped first: the first waiter may stand
-- behind one, and the next may be one.
drop_expired(KEYS[1], KEYS[2], now_ms())
local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if head == ARGV[1] and redis.call('EXISTS', KEYS[3]) == 0 then
  publish_head(KEYS[1], KEYS[2], ARGV[2])
end
return 1
