package lock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// slowWatch confirms every subscription late, as etcd does when a client
// has many watches to create (it confirms them one at a time).
type slowWatch struct {
	lock.LeaseStore
	delay time.Duration
	calls atomic.Int64
}

func (s *slowWatch) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	s.calls.Add(1)
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	return s.LeaseStore.Watch(ctx, name, waiter)
}

// TestSlowSubscriptionIsAskedOnce: a waiter whose subscription is confirmed
// later than its first backoffs keeps attempting at the strategy's pace
// meanwhile, and asks for the subscription once, not again every round:
// etcd confirms a client's watches one at a time, and waiters that gave up
// theirs at each 4 ms round's end and asked again queued ever more of them
// (80 to 200 ms each with 256 waiters on one lock: docs/design.md, defect
// 252). The lock, once released, still goes to the waiter.
func TestSlowSubscriptionIsAskedOnce(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			name := testenv.Name(t)
			holder, err := newClient(t, b.store).Acquire(t.Context(), name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			slow := &slowWatch{LeaseStore: b.store, delay: 150 * time.Millisecond}
			counted := &attemptCounter{LeaseStore: slow, ws: map[string]*waiterSeen{}}
			got := make(chan error, 1)
			go func() {
				l, err := newClient(t, counted).Acquire(context.Background(), name, 5*time.Second, lock.WithWait(30*time.Second))
				if err == nil {
					_ = l.Release(context.Background())
				}
				got <- err
			}()
			// Past the subscription's confirmation: attempts made while it
			// was pending, and the one it is followed by.
			testenv.WaitUntil(t, 30*time.Second, func() bool { ws := counted.attempts(); return len(ws) == 1 && ws[0].n >= 3 })
			testenv.WaitUntil(t, 30*time.Second, func() bool { return slow.calls.Load() >= 1 })
			if err := holder.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiter, after the release: %v", err)
			}
			if n := slow.calls.Load(); n != 1 {
				t.Fatalf("the waiter asked for its subscription %d times, want once", n)
			}
		})
	}
}
