-- Release the Redis-only lock: delete the key only if it still holds this
-- holder's random value, so that a holder whose lock expired cannot delete
-- the lock of the holder after it.
-- KEYS[1] the lock key; ARGV[1] the holder's random value.
-- Returns 1 when deleted, 0 when the lock was no longer this holder's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
