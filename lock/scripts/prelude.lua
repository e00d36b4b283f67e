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


-- A call that changes a reentrant lock's count (a reentry, a release that
-- counts down) carries an id drawn afresh for it, and the token hash's
-- 'ops' field keeps the last few. go-redis sends a script again after a
-- lost reply, with the same arguments: the count must change once
-- (docs/design.md, defect 19). seen reports whether op is in ops (the
-- field's value); record adds it.
local function seen(ops, op)
  -- Redis hands a missing field to Lua as false.
  if not ops or op == '' then return false end
  return string.find(ops, ' ' .. op .. ' ', 1, true) ~= nil
end

local function record(key, ops, op)
  ops = (ops or '') .. ' ' .. op .. ' '
  while #ops > 512 do ops = string.sub(ops, string.find(ops, '  ', 1, true) + 1) end
  redis.call('HSET', key, 'ops', ops)
end
