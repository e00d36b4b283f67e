-- Release the lease if ARGV[1] holds it. KEYS: 1 lease, 2 token (hash),
-- 3 last (the last released lease id and its token), 4 queue, 5 places,
-- 6 released (the lease ids released lately, newest first); an abandon's
-- also 7 abandoned:<lease id>.
-- ARGV: 1 lease id, 2 the release channel, 3 a nonce drawn for this call;
-- an abandon's also 4 the attempt's TTL in ms; 5 '1' to release only a
-- grant no other request of its acquisition was handed (acquire.lua's
-- 'hd'), held once: else it returns 3 and changes nothing (defect 153).
-- Returns 1 when released, 2 when a reentrant holder still holds it (its
-- count went down by one), 0 when not held, 4 when not held and it may
-- have been this lease id's own release that freed it (below).
-- An abandon (the release of an attempt that failed without knowing
-- whether it took the lease; it sends no ARGV[5]) leaves the mark
-- abandoned:<lease id> for the attempt's TTL, whatever it finds: the
-- attempt may still run (a paused Redis, a link that held it, go-redis
-- sending its pipeline again after a lost reply), and acquire.lua then
-- takes nothing (docs/design.md, defects 145, 172). Not only when it finds no
-- trace of the lease: a lease the attempt took and the abandon freed (or
-- counted down, or found released already) is free for the same take run
-- again, which would hold the lock, known to nobody, for its TTL. A lease
-- id is never used again, so the mark blocks nothing else.
-- A release wakes the waiter at the head of the queue (publish_head).
-- Safe to run twice: the last-released record and the released ids, kept
-- for as long as the lease had left, make a retry a success, even after
-- the next holder came and went (docs/design.md, defects 4 and 70). No
-- key outlives the leases it names.
if KEYS[7] then redis.call('SET', KEYS[7], '1', 'PX', ARGV[4]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local h = redis.call('HMGET', KEYS[2], 'c', 't', 'ops', 'hd')
  local c = tonumber(h[1] or '1')
  if ARGV[5] == '1' and (h[4] or c > 1) then return 3 end
  -- A count-down runs once, even if this runs twice (the nonce marks it).
  if seen(h[3], ARGV[3]) then return 2 end
  if c > 1 then
    record(KEYS[2], h[3], ARGV[3])
    -- The one hold left orders its refreshes from here on by its own
    -- sequence numbers, which another process's clock need not match
    -- (refresh.lua, defect 102).
    if redis.call('HINCRBY', KEYS[2], 'c', -1) == 1 then redis.call('HDEL', KEYS[2], 'q') end
    return 2
  end
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('DEL', KEYS[1], KEYS[2])
  if pttl > 0 then
    redis.call('SET', KEYS[3], ARGV[1] .. ' ' .. (h[2] or '0'), 'PX', pttl)
    -- The last record is the next holder's once it releases too: the
    -- last 16 released ids are kept apart as well, in a list that lives
    -- as long as the longest lease it names had left, so that this release
    -- sent again after a handover still finds itself. (A sorted set with
    -- each id's own expiry cost Redis more CPU per release; an id kept
    -- longer than its lease had left is still one its holder released.)
    redis.call('LPUSH', KEYS[6], ARGV[1])
    redis.call('LTRIM', KEYS[6], 0, 15)
    if redis.call('PTTL', KEYS[6]) < pttl then redis.call('PEXPIRE', KEYS[6], pttl) end
  end
  publish_head(KEYS[4], KEYS[5], ARGV[2])
  return 1
end
local last = redis.call('GET', KEYS[3])
if last and string.sub(last, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then return 1 end
local released = redis.call('LRANGE', KEYS[6], 0, 15)
for _, id in ipairs(released) do
  if id == ARGV[1] then return 1 end
end
-- Not held, and no release of it remembered. That is certain while the
-- list has room (fewer than 16 ids, which LTRIM never cut): a release of
-- this id would be in it for as long as the lease had left, so the lease
-- was lost before (a restart without persistence, a failover, a
-- force-release), and a write under it may have overlapped another
-- holder's. A full list may have dropped it after 16 handovers: 4, "not
-- held, and it may have been yours" (Lease.Release, errMaybeReleased).
-- No call more: the LRANGE above counts the list.
if #released < 16 then return 0 end
return 4
