package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// Defect 167: a hand-over write whose reply was lost left the lock held by
// nobody past its TTL (still held 10 s after a 2 s grant, before the fix).
//
// A waiter that asks again after a grant whose answer it lost (Rejoin, a
// fenced server's caller WithWaiter) is handed the grant: handOver writes
// the lock key (its mod revision moves). When that write commits and its
// reply is lost, the store keeps the mod revision it wrote at the create,
// so its compare-and-delete at the lock's deadline finds the lock "no
// longer as this store wrote it" and gives up. Nobody enforces the lock
// then: it stays held, by a lease nobody has, for as long as the store's
// other locks keep the session alive.
//
// docs/design.md, "etcd leases", Deadlines: "a lock whose holder stops
// refreshing is free at its TTL while the store's other locks on the same
// session live on".
func TestEtcdLostHandOverReplyStillExpires(t *testing.T) {
	e, _ := testenv.Etcd(t)
	p, cli := testenv.EtcdThroughProxy(t, e)
	prefix := "/" + testenv.Name(t) + "/"
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	ctx := t.Context()
	const ttl = 2 * time.Second

	// Another lock of the store in the same TTL class, kept alive: the
	// session lives on, as on any busy fenced server.
	keeper := newClient(t, s)
	other, err := keeper.Acquire(ctx, testenv.Name(t)+"-other", ttl, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(context.Background())

	name := testenv.Name(t)
	const (
		l1 = "0123456789abcdef0123456789abcd01"
		l2 = "0123456789abcdef0123456789abcd02"
		w  = "fedcba9876543210fedcba9876543210"
	)
	granted := time.Now()
	if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: l1, TTL: ttl, Waiter: w, Rejoin: w, WaiterTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// The caller never got that answer; it asks again with its waiter id.
	// The only request carrying l1 now is handOver's Txn: lose its reply.
	fired := p.LoseReply([]byte(l1))
	_, err = s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: l2, TTL: ttl, Waiter: w, Rejoin: w, WaiterTTL: 3 * time.Second})
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatalf("the handOver's reply was not lost (second acquire: %v)", err)
	}
	t.Logf("second acquire (hand-over reply lost): %v", err)
	// The caller gives up (its client went away). Nobody refreshes l1.

	direct := testenv.EtcdClient(t, e.ClientURL())
	third := newClient(t, newEtcdStore(t, direct, lock.WithEtcdPrefix(prefix)))
	check := func(at time.Duration) bool {
		time.Sleep(time.Until(granted.Add(at)))
		l, err := third.TryAcquire(ctx, name, ttl)
		if err == nil {
			l.Release(ctx)
			t.Logf("%v after the grant: free", time.Since(granted).Round(10*time.Millisecond))
			return true
		}
		if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("TryAcquire: %v", err)
		}
		st, _ := third.Inspect(ctx, name)
		t.Logf("%v after the grant: still held (%+v)", time.Since(granted).Round(10*time.Millisecond), st)
		return false
	}
	free := false
	for _, at := range []time.Duration{ttl + 500*time.Millisecond, 3 * ttl, 5 * ttl} {
		if free = check(at); free {
			break
		}
	}
	if !free {
		t.Errorf("a %v lock nobody refreshes was still held %v after its grant", ttl, time.Since(granted).Round(100*time.Millisecond))
	}
}
