-- A Redlock node that may have lost leases it took votes again from
-- ARGV[1] ms on, by its own clock: when every lease it may have forgotten
-- is over (RedlockStore.recover). KEYS: 1 <prefix>epoch, set to
-- "<that time in ms> <run_id>", the run_id of this server process, read
-- here and not sent by the client (which may have asked another process
-- behind the same address): acquire.lua trusts an epoch only on the
-- process that set it. The first to set it wins: each caller's wait was
-- long enough.
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
redis.call('SET', KEYS[1], (now_ms() + tonumber(ARGV[1])) .. ' ' .. run, 'NX')
return 1
