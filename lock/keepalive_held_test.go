package lock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// holdFirstRefresh is a store whose backend holds the first refresh sent
// to it unanswered until its caller gives up, as an etcd member cut off
// from its peers holds what it took, or a TCP connection to a Redis that
// is gone holds a call until its read timeout.
type holdFirstRefresh struct {
	lock.LeaseStore
	refreshes, answered atomic.Int64
}

func (h *holdFirstRefresh) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	if h.refreshes.Add(1) == 1 {
		<-ctx.Done()
		return lock.Grant{}, ctx.Err()
	}
	g, err := h.LeaseStore.Refresh(ctx, name, leaseID, ttl, seq)
	if err == nil {
		h.answered.Add(1)
	}
	return g, err
}

// TestKeepAliveSendsAHeldRefreshAgain: a keep-alive refresh that gets no
// answer is given up at half the time left to the deadline and sent
// again, so the lease stays held. Before, it waited until the deadline and
// the lease was lost (defect 108).
func TestKeepAliveSendsAHeldRefreshAgain(t *testing.T) {
	t.Parallel()
	h := &holdFirstRefresh{LeaseStore: redisStore(t, testenv.Redis(t))}
	c := newClient(t, h)
	l, err := c.Acquire(t.Context(), testenv.Name(t), time.Second, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	first := l.Deadline()
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		return l.Err() != nil || h.answered.Load() > 0 && time.Now().After(first)
	})
	if err := l.Err(); err != nil {
		t.Fatalf("a kept-alive lease whose first refresh was held: %v (%d refreshes sent)", err, h.refreshes.Load())
	}
	if !l.Deadline().After(first) {
		t.Fatalf("deadline %v, not past the first %v", l.Deadline(), first)
	}
}
