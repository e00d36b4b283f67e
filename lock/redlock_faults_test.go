package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// startRedlock5 is startRedlock with five nodes, whose clients end a call
// at its context's deadline if contextTimeout (ContextTimeoutEnabled),
// else only at go-redis's own read and write timeouts (go-redis's default,
// and RedisProc.Client's). With five, two nodes down are a minority.
func startRedlock5(t *testing.T, contextTimeout bool) ([]*testenv.RedisProc, *lock.RedlockStore) {
	procs := make([]*testenv.RedisProc, 5)
	clients := make([]redis.UniversalClient, 5)
	for i := range procs {
		procs[i] = testenv.StartRedis(t)
		c := redis.NewClient(&redis.Options{Addr: procs[i].Addr, ContextTimeoutEnabled: contextTimeout})
		t.Cleanup(func() { c.Close() })
		// Dialled before the store's first call, as in startRedlock.
		if err := c.Ping(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	s, err := lock.NewRedlockStore(clients, newSequencer(t), lock.WithNodeTimeout(testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return procs, s
}

// restartOneFreezeAnother restarts node 0 empty and freezes node 1
// (SIGSTOP: a link that drops packets looks the same), two of five.
func restartOneFreezeAnother(t *testing.T, procs []*testenv.RedisProc) {
	t.Helper()
	if err := procs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	if err := procs[0].Client().Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	procs[1].Stop()
	t.Cleanup(procs[1].Cont)
}

// A node restarted empty votes again beside a frozen node, once every lease
// it may have forgotten is over, since enough of the others answer
// (docs/design.md, defects 103 and 201). Node 0's recover reads the
// horizons of nodes 1 to 4, and three answers (5 − 3 + 1) are enough; the
// read of frozen node 1 used up the node timeout, and the epoch was then
// written with a context already over: no epoch, and node 0 took no lease
// for as long as node 1 was frozen (10 acquisitions over 8 s, 3 of 3 runs).
func TestRedlockRestartedNodeRecoversBesideAFrozenOne(t *testing.T) {
	t.Parallel()
	procs, s := startRedlock5(t, true)
	warmUp(t, s)
	restartOneFreezeAnother(t, procs)
	node0 := procs[0].Client()
	name := testenv.Name(t)
	leaseKey := "fenced:{" + name + "}:lease"
	n := 0
	// The warm-up's lease, 2 s, is the longest node 0 may have forgotten:
	// it sits out about 2.3 s.
	testenv.WaitUntil(t, 8*time.Second, func() bool {
		n++
		g, err := s.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: time.Second})
		if err != nil {
			t.Fatalf("acquisition %d with nodes 2, 3 and 4 healthy: %v", n, err)
		}
		on0, _ := node0.Get(t.Context(), leaseKey).Result()
		if err := s.Release(t.Context(), name, g.LeaseID, ""); err != nil {
			t.Fatal(err)
		}
		if on0 != g.LeaseID {
			epoch, _ := node0.Get(t.Context(), "fenced:epoch").Result()
			t.Logf("acquisition %d: node 0 took no lease (its epoch: %q)", n, epoch)
		}
		return on0 == g.LeaseID
	})
	t.Logf("node 0 votes again at acquisition %d", n)
}

// Beside a restarted node and a frozen one, an acquisition on clients
// without ContextTimeoutEnabled is granted within its caller's 2 s
// deadline: a dead node costs at most the node timeout per operation
// (docs/design.md, defect 202). Recover's read of the frozen node's
// horizon was a direct call, which such a client ends only at its read
// timeout: each acquisition waited 5 s for it, and then failed (its leases
// expired, or its deadline passed), 3 of 3 runs.
func TestRedlockPlainClientsAcquireBesideAFrozenNode(t *testing.T) {
	t.Parallel()
	procs, s := startRedlock5(t, false)
	warmUp(t, s)
	restartOneFreezeAnother(t, procs)
	name := testenv.Name(t)
	for n := 1; n <= 2; n++ {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		start := time.Now()
		g, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: 2 * time.Second})
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Fatalf("acquisition %d, nodes 2, 3 and 4 healthy: %v after %s; want a grant within the caller's 2 s", n, err, took.Round(time.Millisecond))
		}
		if err := s.Release(t.Context(), name, g.LeaseID, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// Watch beside a frozen node, on clients without ContextTimeoutEnabled,
// returns within the node timeout, give or take (the bound is ten of them,
// for a loaded machine, and half of what it took before): nodes subscribe at once,
// each within the node timeout (docs/design.md, defect 202). A node's first
// subscription was sent under the notifier's lock and waited out go-redis's
// timeouts on the frozen node: 5.0 s (3 of 3), with the node timeout
// 250 ms.
func TestRedlockWatchBesideAFrozenNodePlainClients(t *testing.T) {
	t.Parallel()
	procs, s := startRedlock(t) // the suite's clients: no ContextTimeoutEnabled
	warmUp(t, s)
	procs[0].Stop()
	t.Cleanup(procs[0].Cont)
	for _, name := range []string{testenv.Name(t), testenv.Name(t) + "-2"} {
		start := time.Now()
		_, stop, err := s.Watch(t.Context(), name, "")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("Watch with node 0 of three frozen: %v", err)
		}
		stop()
		if took > 10*testNodeTimeout {
			t.Fatalf("Watch of %s with node 0 of three frozen took %s; the node timeout is %s", name, took.Round(time.Millisecond), testNodeTimeout)
		}
	}
}

// A fair waiter granted on a majority leaves the queue of every node: of
// node 2 too, where the lock was held by another lease, so it queued
// (docs/design.md, "Fair waiting", and defect 203). Its place stayed at
// the head of node 2's queue for the waiter TTL after the grant: with node
// 0 then frozen, the free lock went to nobody, every attempt answered
// "held", for 3.5 s (3 of 3 runs).
func TestRedlockGrantedWaiterLeavesEveryQueue(t *testing.T) {
	t.Parallel()
	procs, _, s := startProxiedRedlock(t, nil)
	warmUp(t, s)
	ctx := t.Context()
	name := testenv.Name(t)
	queueKey := "fenced:{" + name + "}:queue"
	node2 := procs[2].Client()
	w1 := acquireBeside(t, newClient(t, s), node2, name, 10*time.Second)
	q, _ := node2.ZRange(ctx, queueKey, 0, -1).Result()
	t.Logf("node 2's queue after the grant: %q", q)
	// Left within a few node timeouts; not by its place's own life, 3 s.
	testenv.WaitUntil(t, 1500*time.Millisecond, func() bool {
		n, err := node2.ZCard(ctx, queueKey).Result()
		return err == nil && n == 0
	})
	if err := w1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	procs[0].Stop()
	t.Cleanup(procs[0].Cont)
	start := time.Now()
	w2, err := newClient(t, s).Acquire(ctx, name, time.Second, lock.WithWait(10*time.Second))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if took > 2500*time.Millisecond {
		t.Fatalf("the free lock, node 0 of three frozen, went to the only waiter after %s; want it well within the old place's 3.5 s", took.Round(time.Millisecond))
	}
}

// A reentry granted on a majority frees the lease its attempt took on a
// node where the lock was free (docs/design.md, defect 204). Node 2 held
// another lease when the holder took the lock on nodes 0 and 1; with it
// gone, the holder's reentry counted on nodes 0 and 1 and took a fresh
// lease, its attempt's, on node 2, which nobody released: it held node 2
// for its TTL (30 s), known to nobody, and with node 0 then frozen nobody
// could take the lock after the holder let it go.
func TestRedlockReentryFreesItsAttemptsLease(t *testing.T) {
	t.Parallel()
	procs, _, s := startProxiedRedlock(t, nil)
	warmUp(t, s)
	ctx := t.Context()
	name := testenv.Name(t)
	leaseKey := "fenced:{" + name + "}:lease"
	node2 := procs[2].Client()
	c := newClient(t, s)
	held := acquireBeside(t, c, node2, name, 30*time.Second, lock.WithHolder("worker-1"))
	again, err := c.TryAcquire(ctx, name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	if again.ID() != held.ID() {
		t.Fatalf("the reentry's lease id %s, want the holder's %s", again.ID(), held.ID())
	}
	on2, _ := node2.Get(ctx, leaseKey).Result()
	t.Logf("node 2's lease after the reentry: %q (the holder's: %s)", on2, held.ID())
	testenv.WaitUntil(t, 5*time.Second, func() bool { // the lease's TTL: 30 s
		return node2.Get(ctx, leaseKey).Err() == redis.Nil
	})
	for _, l := range []*lock.Lease{again, held} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	procs[0].Stop()
	t.Cleanup(procs[0].Cont)
	l, err := newClient(t, s).TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatalf("the free lock, node 0 of three frozen: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
