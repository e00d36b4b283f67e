package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// TestRedisEvicts: a Redis with a maxmemory and an evicting policy may
// evict a held lease (every key of the store has a TTL, so volatile-lru
// picks among them); noeviction, or no maxmemory, may not. A Cluster is
// asked master by master.
func TestRedisEvicts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r := testenv.StartRedis(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru")
	rdb := r.Client()
	for _, c := range []struct {
		set    []string // CONFIG SET pairs
		evicts bool
		policy string
	}{
		{nil, true, "volatile-lru"},
		{[]string{"maxmemory-policy", "noeviction"}, false, "noeviction"},
		{[]string{"maxmemory-policy", "allkeys-lru", "maxmemory", "0"}, false, "allkeys-lru"},
	} {
		if c.set != nil {
			if err := rdb.ConfigSet(ctx, c.set[0], c.set[1]).Err(); err != nil {
				t.Fatal(err)
			}
			if len(c.set) > 2 {
				if err := rdb.ConfigSet(ctx, c.set[2], c.set[3]).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		evicts, policy, err := lock.RedisEvicts(ctx, rdb)
		if err != nil || evicts != c.evicts || policy != c.policy {
			t.Fatalf("after CONFIG SET %q: evicts %v, policy %q, %v; want %v, %q", c.set, evicts, policy, err, c.evicts, c.policy)
		}
	}

	nodes := testenv.StartRedisCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	t.Cleanup(func() { cc.Close() })
	if evicts, policy, err := lock.RedisEvicts(ctx, cc); err != nil || evicts || policy != "noeviction" {
		t.Fatalf("cluster of noeviction masters: evicts %v, policy %q, %v", evicts, policy, err)
	}
	last := nodes[2].Client()
	if err := last.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := last.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatal(err)
	}
	if evicts, policy, err := lock.RedisEvicts(ctx, cc); err != nil || !evicts || policy != "volatile-ttl" {
		t.Fatalf("cluster with one evicting master: evicts %v, policy %q, %v; want true, volatile-ttl", evicts, policy, err)
	}
}

// A lease key gone alone (evicted under a volatile-* policy, deleted by
// hand) left its token hash behind, and the next lease of the name failed
// its confirm on that hash's token: the acquisition returned ErrLost and
// its own lease key stayed, held by nobody, for its TTL; a reentry of the
// old holder would have been handed the new lease. A new lease now starts
// with no hash (docs/design.md, defect 142).
func TestLeaseKeyGoneAloneLeavesNoStaleToken(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := redisBackend(t)
	c := newClient(t, b.store)
	name := testenv.Name(t)
	old, err := c.TryAcquire(ctx, name, 30*time.Second, lock.WithHolder("old"), lock.WithOwner("old"))
	if err != nil {
		t.Fatal(err)
	}
	b.deleteLease(t, name)
	next, err := c.TryAcquire(ctx, name, time.Hour)
	if err != nil {
		t.Fatalf("acquiring after the lease key went: %v", err)
	}
	if next.Token() <= old.Token() {
		t.Fatalf("token %d after %d", next.Token(), old.Token())
	}
	if st, err := c.Inspect(ctx, name); err != nil || st.Token != next.Token() || st.Owner != "" {
		t.Fatalf("inspect: %+v, %v; want the new lease's token %d and no owner", st, err, next.Token())
	}
	// The old holder's reentry finds the lock held, not the new lease.
	if _, err := c.TryAcquire(ctx, name, 30*time.Second, lock.WithHolder("old")); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the old holder's reentry: %v, want ErrNotAcquired", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after the release: %+v, %v", st, err)
	}
}
