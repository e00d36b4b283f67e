package main_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestClientSurvivesAKilledNode runs three fenced serve nodes over one
// Redis and one etcd, and a client of all three. It kills the node the
// client uses with SIGKILL while the client holds a kept-alive lease and
// waits for another lock there: the lease stays held through the other
// nodes, the waiter moves on and gets its lock, and tokens keep growing.
func TestClientSurvivesAKilledNode(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	prefix := testenv.Name(t)
	var urls []string
	var nodes []*proc
	for i := 0; i < 3; i++ {
		p := start(t, []string{"FENCED_REDIS_ADDR=" + testenv.RedisAddr(), "FENCED_ETCD_ENDPOINTS=" + e.ClientURL()},
			"serve", "--listen", "127.0.0.1:0", "--redis-prefix", prefix+":", "--etcd-prefix", "/"+prefix+"/")
		nodes = append(nodes, p)
		urls = append(urls, p.listening())
	}
	c, err := client.New(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(t.Context()) })
	ctx := t.Context()

	const ttl = time.Second
	held, err := c.Acquire(ctx, "held-"+prefix, ttl, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	// Another holder has the waiter's lock, through node 1.
	other := newAPI(t, urls[1])
	waitedFor := "waited-" + prefix
	blocker := other.acquire(waitedFor, 30000)
	type result struct {
		l   *client.Lease
		err error
	}
	waiter := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, waitedFor, ttl, lock.WithWait(60*time.Second))
		waiter <- result{l, err}
	}()
	n0 := newAPI(t, urls[0])
	eventually(t, 20*time.Second, "the waiter waits on node 0", func() bool {
		code, body := n0.text("/metrics")
		return code == 200 && strings.Contains(body, "\nfenced_waiters 1\n")
	})

	nodes[0].signal(syscall.SIGKILL)
	nodes[0].wait(10 * time.Second)
	killed := time.Now()

	// The waiter's request died with node 0; it waits on another node and
	// gets the lock when the holder releases it.
	other.release(waitedFor, blocker.id)
	var w result
	select {
	case w = <-waiter:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not get its lock after node 0 died and the holder released it")
	}
	if w.err != nil {
		t.Fatalf("waiter: %v", w.err)
	}
	if uint64(w.l.Token()) <= blocker.token {
		t.Fatalf("waiter's token %d, want above the blocker's %d", w.l.Token(), blocker.token)
	}
	if err := w.l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The kept-alive lease outlives node 0 by more than its TTL: its
	// refreshes go to the others.
	eventually(t, 20*time.Second, "the lease refreshed past its TTL after the kill", func() bool {
		return held.Deadline().After(killed.Add(2 * ttl))
	})
	if err := held.Err(); err != nil {
		t.Fatalf("the kept-alive lease was lost after node 0 died: %v", err)
	}
	st, err := c.Inspect(ctx, held.Name())
	if err != nil || !st.Held || st.Token != held.Token() {
		t.Fatalf("inspect through the survivors: %+v, %v", st, err)
	}
	last := held.Token()
	for i := 0; i < 3; i++ {
		l, err := c.TryAcquire(ctx, fmt.Sprint("after-", i, "-", prefix), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("token %d after %d", l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
