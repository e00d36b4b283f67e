-- Release the lease if ARGV[1] holds it. KEYS: 1 lease, 2 token (hash),
-- 3 last (the last released lease id and its token), 4 queue, 5 places,
-- 6 released (the lease ids released lately, newest first); an abandon's
-- also 7 abandoned:<lease id>.
-- ARGV: 1 lease id, 2 the release channel, 3 a nonce drawn for this call;
-- an abandon's also 4 the attempt's TTL in ms; 5 '1' to release only a
-- grant no other request of its acquisition was handed (acquire.lua's
-- 'hd'), held once: else it returns 3 and changes nothing (defect 153).
-- Returns 1 when released, 2 when a reentrant holder still holds it (its
-- count went down by one), 0 when not held.
-- An abandon (the release of an attempt that failed without knowing
-- whether it took the lease) that finds no trace of the lease leaves the
-- mark abandoned:<lease id> for the attempt's TTL: the attempt may still
-- run (a paused Redis, a link that held it), and acquire.lua then takes
-- nothing (docs/design.md, defect 145).
-- A release wakes the waiter at the head of the queue (publish_head).
-- Safe to run twice: the last-released record and the released ids, kept
-- for as long as the lease had left, make a retry a success, even after
-- the next holder came and went (docs/design.md, defects 4 and 70). No
-- key outlives the leases it names.
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
for _, id in ipairs(redis.call('LRANGE', KEYS[6], 0, 15)) do
  if id == ARGV[1] then return 1 end
end
if KEYS[7] then redis.call('SET', KEYS[7], '1', 'PX', ARGV[4]) end
return 0
