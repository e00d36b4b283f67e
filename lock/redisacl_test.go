package lock_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// TestRedisACLRulesAreEnough: a Redis ACL user with only the rules of
// RedisACLRules (the README's least-privilege line) can do everything the
// store does, on a single Redis and on a Cluster, and Redis logs no refusal: the rules name every command the
// store and its scripts send, its keys and its channels (docs/design.md,
// defect 211).
func TestRedisACLRulesAreEnough(t *testing.T) {
	const prefix, password = "app-a:", "acl-test-secret-0123"
	// setUser makes the user on each node; Redis Cluster keeps ACLs per node.
	setUser := func(t *testing.T, nodes ...*testenv.RedisProc) {
		args := []any{"ACL", "SETUSER", "fenced", "on", ">" + password, "resetkeys", "resetchannels", "-@all"}
		for _, rule := range strings.Fields(lock.RedisACLRules(prefix)) {
			args = append(args, rule)
		}
		for _, n := range nodes {
			if err := n.Client().Do(t.Context(), args...).Err(); err != nil {
				t.Fatalf("ACL SETUSER %v: %v", args[2:], err)
			}
		}
	}
	t.Run("Single", func(t *testing.T) {
		r := testenv.StartRedis(t)
		setUser(t, r)
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr, Username: "fenced", Password: password, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		everyOperationAsTheUser(t, rdb, prefix, r)
	})
	t.Run("Cluster", func(t *testing.T) {
		nodes := testenv.StartRedisCluster(t, 3)
		setUser(t, nodes...)
		addrs := make([]string, len(nodes))
		for i, n := range nodes {
			addrs[i] = n.Addr
		}
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: "fenced", Password: password, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		everyOperationAsTheUser(t, rdb, prefix, nodes...)
	})
}

// everyOperationAsTheUser runs each operation of a RedisStore on rdb and
// fails unless each succeeds and no node logged a refusal.
func everyOperationAsTheUser(t *testing.T, rdb redis.UniversalClient, prefix string, nodes ...*testenv.RedisProc) {
	ctx := t.Context()
	s, err := lock.NewRedisStore(rdb, newSequencer(t), lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := newClient(t, s)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if _, _, err := lock.RedisEvicts(ctx, rdb); err != nil {
		t.Fatalf("RedisEvicts: %v", err)
	}
	for _, name := range []string{testenv.Name(t) + "-a", testenv.Name(t) + "-b", testenv.Name(t) + "-c"} {
		// Hold, reenter, and have a fair waiter woken by the release.
		l, err := c.Acquire(ctx, name, 5*time.Second, lock.WithHolder("me"))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		again, err := c.Acquire(ctx, name, 5*time.Second, lock.WithHolder("me"))
		if err != nil {
			t.Fatalf("reentry: %v", err)
		}
		if err := l.Refresh(ctx, 5*time.Second); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := c.Acquire(ctx, name, 5*time.Second, lock.WithWait(20*time.Second))
			if err == nil {
				err = w.Release(ctx)
			}
			got <- err
		}()
		testenv.WaitUntil(t, 10*time.Second, func() bool {
			st, err := c.Inspect(ctx, name)
			return err == nil && st.Waiters == 1
		})
		if err := errors.Join(again.Release(ctx), l.Release(ctx)); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := <-got; err != nil {
			t.Fatalf("the waiter: %v", err)
		}
		if _, err := c.TryAcquire(ctx, name, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ForceRelease(ctx, name); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
	}
	if _, err := c.List(ctx, "", 10, ""); err != nil {
		t.Fatalf("List: %v", err)
	}
	// Redis logs every refusal, also of a command whose error was dropped.
	for i, n := range nodes {
		if denied, err := n.Client().Do(ctx, "ACL", "LOG").Slice(); err != nil || len(denied) > 0 {
			t.Errorf("node %d: ACL LOG: %v, %v; want no refusal", i, denied, err)
		}
	}
}

// TestREADMEHasTheRedisACLRules: the README's line is RedisACLRules's.
func TestREADMEHasTheRedisACLRules(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := lock.RedisACLRules("fenced:"); !strings.Contains(string(b), "resetchannels -@all "+want+"\n") {
		t.Fatalf("README's Redis ACL section does not give the rules of RedisACLRules(%q):\n%s", "fenced:", want)
	}
}
