package lock

import (
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// A fair create joins the queue in its Txn's Else only where the lock is
// likely taken (this store holds it or has other waiters on it): the
// Else's operations travel with every create, run or not, and cost an
// uncontended lock a tenth of its throughput.
func TestFirstAttemptJoinsOnlyWhereTaken(t *testing.T) {
	c, s := etcdClient(t)
	ctx := t.Context()
	sess, err := s.sessionFor(ctx, 5*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	elseOps := func(name string) int {
		t.Helper()
		id, _ := newLeaseID()
		waiter, _ := newLeaseID()
		op := s.createOp(AcquireRequest{Name: name, TTL: 5 * time.Second, LeaseID: id, Waiter: waiter, WaiterTTL: DefaultWaiterTTL}, sess, time.Now())
		s.mu.Lock()
		s.unplaceLocked(placeKey{name, waiter})
		s.mu.Unlock()
		return len(s.opTxn(op, 0).els)
	}
	free := testenv.Name(t) + "-free"
	if n := elseOps(free); n != 0 {
		t.Errorf("a fair first attempt on a lock this store knows nothing of carries %d Else operations, want none", n)
	}
	taken := testenv.Name(t) + "-taken"
	l, err := c.Acquire(ctx, taken, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if n := elseOps(taken); n != 3 {
		t.Errorf("a fair first attempt on a lock this store holds carries %d Else operations, want the join's 3", n)
	}
}
