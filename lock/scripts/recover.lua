-- A Redlock node that lost its data votes again from ARGV[1] ms on, by
-- its own clock: when every lease it may have forgotten is over
-- (RedlockStore.recover). KEYS: 1 <prefix>epoch. The first to set it wins:
-- each caller's wait was long enough.
redis.call('SET', KEYS[1], now_ms() + tonumber(ARGV[1]), 'NX')
return 1
