-- Step 2 of the acquisition protocol: take the lease if it is free.
-- KEYS: 1 lease, 2 token (hash: t token, o owner, h holder, c count),
--       3 queue (zset: waiter by arrival), 4 places (zset: waiter by expiry),
--       5 abandoned:<lease id> (release.lua); a Redlock node's also
--       6 <prefix>epoch and 7 <prefix>horizon (below).
-- ARGV: 1 lease id, 2 ttl ms, 3 waiter ('' takes a free lock whatever the
--       queue: unfair), 4 a place's ttl ms, 5 holder ('' not reentrant),
--       6 the id of a remote acquisition ('' for none; a fair one's is its
--       waiter), which its grant records (confirm.lua), 7 the release
--       channel, where a waiter that leaves the head of the queue names the
--       next (leave_queue).
-- Returns {0} when this lease id now holds the lease (to be confirmed);
-- {1, lease id, token, count} when the holder already held it (reentry,
-- the lease extended to ttl ms unless it had longer);
-- {2, holder's remaining ms (at least 1), or 0 if unknown or free, place in
-- the queue or -1} when not; {4, the lease's remaining ms} when an earlier
-- request of the same remote acquisition (ARGV[6]) took it and has not
-- confirmed it yet. An acquisition that finds the lease granted to
-- its id already (a remote one whose answer was lost, see confirm.lua) gets
-- {1, lease id, token, count}, as a reentry with the count unchanged, the
-- lease extended to ttl ms (not shortened while held more than once).
-- Safe to run twice: a retry after a lost reply finds its own lease id
-- (docs/design.md, defect 4).
-- A Redlock node passes KEYS 6 and 7, its epoch and horizon. A node that
-- may have lost leases it took has no epoch it can trust, and takes no
-- lease until RedlockStore.recover has set one (recover.lua); until the
-- time the epoch holds, every lease it may have forgotten may still be
-- held on a bare majority with it, so it takes none either (docs/design.md,
-- defects 103, 178). Then {3, ms to wait, -1 if no epoch}. The epoch names the
-- run_id of the server process that set it; one of another process, or
-- one without a run_id (set by an earlier fenced), is deleted and counts
-- as none. A run_id is new at each start, and a promoted replica's is its
-- own: so a restart, with or without persistence, and a failover to a
-- replica make the node wait. Persistence does not shorten the wait: an
-- RDB snapshot, an AOF fsynced every second, a replica's asynchronous copy
-- keep the epoch, written long before, but may miss the latest leases,
-- and nothing tells what they kept from what they missed.
-- The horizon outlives every lease the node took, reentered or refreshed:
-- its TTL, when it falls below the TTL asked for, goes to that plus an
-- eighth (a write per eighth of a TTL, not per acquire).
-- An attempt its caller abandoned takes nothing: a Redis that was paused,
-- or a link that held the request, can run it after the caller gave up
-- and its abandon ran first, which found no lease to free and left this
-- mark; the lease taken then would keep the lock, known to nobody, for its
-- TTL (docs/design.md, defect 145).
if redis.call('EXISTS', KEYS[5]) == 1 then return {2, 0, -1} end
if KEYS[6] then
  -- "<ms> <run_id>" (recover.lua), compared and deleted in one script: an
  -- epoch that another caller's recover.lua set anew, with this run_id, is
  -- never deleted.
  local epoch = redis.call('GET', KEYS[6])
  local from, run = string.match(epoch or '', '^(%d+) (%x+)$')
  if epoch and run ~= string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') then
    redis.call('DEL', KEYS[6])
    epoch = nil
  end
  if not epoch then return {3, -1} end
  local wait = tonumber(from) - now_ms()
  if wait > 0 then return {3, wait} end
  local ttl = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[7]) < ttl then
    redis.call('SET', KEYS[7], '1', 'PX', ttl + math.floor(ttl / 8))
  end
end
-- A new lease takes no token hash from an earlier one: the hash lives no
-- longer than its lease, unless the lease key alone went (an evicting
-- policy, a DEL by hand). Left, it failed this lease's confirm, which kept
-- the lock for this lease's TTL, known to nobody, and a reentry of its
-- holder would be handed this lease (docs/design.md, defect 142).
-- The common case first: nobody waits, so a free lock goes to whoever asks.
-- A remote acquisition's id goes into the new lease's token hash at once
-- (confirm.lua writes it again): its next request, sent while this one is
-- still taking its token, is told so ({4}), not that another holds the
-- lock (docs/design.md, defect 158).
local function taken()
  redis.call('DEL', KEYS[2])
  if ARGV[6] ~= '' then
    redis.call('HSET', KEYS[2], 'w', ARGV[1] .. ' ' .. ARGV[6])
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    taken()
    return {0}
  end
end
local now = now_ms()
drop_expired(KEYS[3], KEYS[4], now)
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then return {0} end
if cur and ARGV[6] ~= '' then
  -- Bound to the lease id, so that a record left by an earlier lease of
  -- this name can never hand over a later one.
  local g = redis.call('HMGET', KEYS[2], 'w', 't', 'c')
  if g[1] == cur .. ' ' .. ARGV[6] and not g[2] then
    return {4, math.max(redis.call('PTTL', KEYS[1]), 1)}
  end
  if g[1] == cur .. ' ' .. ARGV[6] and g[2] then
    if ARGV[3] ~= '' then
      leave_queue(KEYS[3], KEYS[4], ARGV[3], ARGV[7])
    end
    -- Handed to this request: the request that made the grant, whose
    -- client went away, may no longer release it (release.lua, defect 153).
    redis.call('HSET', KEYS[2], 'hd', '1')
    -- Extended to the TTL asked for, which the caller counts from this
    -- attempt, as a refresh does (never shortened under reentrant holds).
    local c = tonumber(g[3] or '1')
    local ttl = tonumber(ARGV[2])
    if c > 1 then ttl = math.max(ttl, redis.call('PTTL', KEYS[1])) end
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    return {1, cur, g[2], c}
  end
end
if cur and ARGV[5] ~= '' then
  local h = redis.call('HMGET', KEYS[2], 'h', 't', 'c', 'ops')
  if h[1] == ARGV[5] and h[2] then
    -- A reentry: one more hold, counted once even if this runs twice (the
    -- acquisition's id or waiter marks it, which a request sent again
    -- after a lost answer carries too, defect 42; else the attempt's own
    -- lease id, as AcquireRequest.mark), its place in the queue given up,
    -- and the lease extended to the new TTL but never shortened under the
    -- holds before it (defect 19).
    local c = tonumber(h[3] or '1')
    local op = ARGV[1]
    if ARGV[6] ~= '' then op = 'w' .. ARGV[6] elseif ARGV[3] ~= '' then op = 'w' .. ARGV[3] end
    if not seen(h[4], op) then
      local ops = record(KEYS[2], h[4], op)
      -- A remote acquisition's reentry also records the attempt that
      -- counted it, so that a copy of the request (another attempt) that
      -- finds the hold counted marks it handed ('h' and the mark): the
      -- request that counted it, its client gone, may then no longer take
      -- it off (unreenter.lua, docs/design.md, defect 183). This very
      -- attempt sent again by go-redis is no copy.
      if ARGV[6] ~= '' then record(KEYS[2], ops, 'a' .. ARGV[1]) end
      c = redis.call('HINCRBY', KEYS[2], 'c', 1)
    elseif ARGV[6] ~= '' and not seen(h[4], 'a' .. ARGV[1]) and not seen(h[4], 'h' .. op) then
      record(KEYS[2], h[4], 'h' .. op)
    end
    if ARGV[3] ~= '' then
      leave_queue(KEYS[3], KEYS[4], ARGV[3], ARGV[7])
    end
    local ttl = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    return {1, cur, h[2], c}
  end
end
if not cur then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if ARGV[3] == '' or head == nil or head == ARGV[3] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    taken()
    if ARGV[3] ~= '' then
      leave_queue(KEYS[3], KEYS[4], ARGV[3], ARGV[7])
    end
    return {0}
  end
end
local pos = -1
if ARGV[3] ~= '' then
  if not redis.call('ZSCORE', KEYS[3], ARGV[3]) then
    -- Arrival order: the time in microseconds, and strictly after the
    -- last arrival, so that two waiters never tie (a tie would order them
    -- by id, not by arrival).
    local arrival = now * 1000
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    if last and tonumber(last) >= arrival then arrival = tonumber(last) + 1 end
    redis.call('ZADD', KEYS[3], arrival, ARGV[3])
  end
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), ARGV[3])
  -- The queue lives as long as its longest place.
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[3], last[2])
  redis.call('PEXPIREAT', KEYS[4], last[2])
  pos = redis.call('ZRANK', KEYS[3], ARGV[3])
end
-- A held lease has at least 1 ms left: PTTL is 0 in its last millisecond,
-- and 0 tells the waiter "unknown", which it answers with a full backoff.
-- -1 (a lease with no TTL, never set so by fenced) stays unknown.
local pttl = 0
if cur then
  local p = redis.call('PTTL', KEYS[1])
  if p >= 0 then pttl = math.max(p, 1) end
end
return {2, pttl, pos}
