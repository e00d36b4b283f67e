-- The PTTL of KEYS[1] in ms: -2 when it does not exist, -1 when it has no
-- TTL. A script rather than the command, so that it goes through the
-- store's pipelines, which a caller leaves at its context's end even on a
-- client that ends a call only at its own timeouts (a Redlock node's
-- horizon and lease, RedlockStore.recover and List; docs/design.md,
-- defect 202).
return redis.call('PTTL', KEYS[1])
