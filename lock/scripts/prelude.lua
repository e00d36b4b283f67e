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

