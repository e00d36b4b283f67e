package lock

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// RedisEvicts reports whether the Redis behind rdb may evict a held lease
// before its TTL: it has a maxmemory and a maxmemory-policy other than
// noeviction. Every key of a RedisStore has a TTL, so the volatile-*
// policies choose among them too, and managed Redis services often default
// to one. An evicted lease lets another holder take the lock before the
// TTL (the fencing token still rejects the first holder's later writes,
// but the lock no longer keeps them apart). policy is the policy of a node
// that may evict, else "noeviction" or the one Redis reported. For a
// Cluster every master is asked. The answer comes from INFO memory, which
// an ACL may refuse: err then says so.
func RedisEvicts(ctx context.Context, rdb redis.UniversalClient) (evicts bool, policy string, err error) {
	var mu sync.Mutex // ForEachMaster asks the masters at once
	check := func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		maxmemory, p := infoField(info, "maxmemory"), infoField(info, "maxmemory_policy")
		if p == "" || maxmemory == "" {
			return fmt.Errorf("INFO memory has no maxmemory or maxmemory_policy")
		}
		mu.Lock()
		defer mu.Unlock()
		if maxmemory != "0" && p != "noeviction" {
			evicts, policy = true, p
		} else if !evicts {
			policy = p
		}
		return nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return check(ctx, c) })
	} else {
		err = check(ctx, rdb)
	}
	if err != nil {
		return false, "", backendErr("redis", "read maxmemory-policy", err)
	}
	return evicts, policy, nil
}

// infoField is the value of field in an INFO answer ("field:value" lines).
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
