-- Shared by the scripts that touch the fair-waiting queue; prepended to
-- each of them (see redis.go).

-- now_ms is the Redis server's time in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- drop_expired removes the waiters whose place expired (they gave up or
-- died) from the queue and the places.
local function drop_expired(queue, places, now)
  local gone = redis.call('ZRANGEBYSCORE', places, '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', queue, unpack(gone))
    redis.call('ZREMRANGEBYSCORE', places, '-inf', now)
  end
end

-- publish_head tells the waiters on channel that the lock is free: it
-- publishes the id of the waiter at the head of the queue, once the places
-- that expired are dropped, or '' if none waits. Only that waiter then
-- tries (no thundering herd), with every unfair one; a dead place named
-- instead would leave the live waiter behind it to its backoff
-- (docs/design.md, defect 39).
local function publish_head(queue, places, channel)
  local head = ''
  if redis.call('EXISTS', queue) == 1 then
    drop_expired(queue, places, now_ms())
    head = redis.call('ZRANGE', queue, 0, 0)[1] or ''
  end
  redis.call('PUBLISH', channel, head)
end

-- leave_queue takes waiter's place out of the queue. If it was the head,
-- the waiter now at the head is told so, with the payload 'next:<id>',
-- which wakes that waiter alone (the lock is not free: no unfair waiter
-- need look): it may be where the lock goes next, by its holder's release
-- or expiry, and a waiter behind the head attempts only every third of its
-- place's life, so that an expiry nobody publishes found the new head
-- asleep for up to a second (docs/design.md, defect 250).
local function leave_queue(queue, places, waiter, channel)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', places, waiter)
  if head ~= waiter or channel == '' or redis.call('EXISTS', queue) == 0 then return end
  drop_expired(queue, places, now_ms())
  local next = redis.call('ZRANGE', queue, 0, 0)[1]
  if next then redis.call('PUBLISH', channel, 'next:' .. next) end
end

-- A call that changes a reentrant lock's count (a reentry, a release that
-- counts down) carries an id drawn afresh for it, and the token hash's
-- 'ops' field keeps the last few. go-redis sends a script again after a
-- lost reply, with the same arguments: the count must change once
-- (docs/design.md, defect 19). seen reports whether op is in ops (the
-- field's value); record adds it and returns the field's new value.
local function seen(ops, op)
  -- Redis hands a missing field to Lua as false.
  if not ops or op == '' then return false end
  return string.find(ops, ' ' .. op .. ' ', 1, true) ~= nil
end

local function record(key, ops, op)
  ops = (ops or '') .. ' ' .. op .. ' '
  while #ops > 512 do ops = string.sub(ops, string.find(ops, '  ', 1, true) + 1) end
  redis.call('HSET', key, 'ops', ops)
  return ops
end
