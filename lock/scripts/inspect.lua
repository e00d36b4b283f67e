-- Who holds the lease, and who waits. KEYS: 1 lease, 2 token (hash),
-- 3 last, 4 queue, 5 places.
-- Returns {lease id or false, remaining ms, token, owner, holder, count,
-- waiters, oldest arrival in µs or false, now in ms, last released or false}.
local now = now_ms()
local tok = redis.call('HMGET', KEYS[2], 't', 'o', 'h', 'c')
local waiters = redis.call('ZCOUNT', KEYS[5], now, '+inf')
local oldest = false
if waiters > 0 then
  -- The oldest arrival among waiters whose place is still live.
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    local exp = redis.call('ZSCORE', KEYS[5], w)
    if exp and tonumber(exp) > now then
      oldest = redis.call('ZSCORE', KEYS[4], w)
      break
    end
  end
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), tok[1], tok[2], tok[3], tok[4],
  waiters, oldest, tostring(now), redis.call('GET', KEYS[3])}
