-- Who holds the lease: {lease id or false, remaining ms, token or false}.
-- KEYS[1] lease key, KEYS[2] token key.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
