-- The readiness probe (Ping): one small write, made as the other scripts
-- make theirs, so that a Redis that answers PING but refuses writes is not
-- taken for ready: one out of memory under maxmemory with noeviction
-- (OOM), or a read-only replica (READONLY). Every acquire would fail the
-- same. (A failed snapshot's MISCONF refuses PING too.)
-- KEYS: 1 <prefix>ready, which no lock's keys can be (theirs have {name}).
return redis.call('SET', KEYS[1], '1', 'PX', 60000)
