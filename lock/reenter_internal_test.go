package lock

import (
	"context"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// A reentry on etcd leases is two steps, a refresh and a count. It used
// to count first: when the refresh then failed (the caller's context
// ended, etcd timed out), the acquire failed with the count raised, and
// the holder's last release left the lock held (defect 19). It now
// refreshes first, so a reentry that fails between the steps counts
// nothing.
func TestEtcdFailedReentryCountsNothing(t *testing.T) {
	c, _ := etcdClient(t)
	ctx := t.Context()
	name := testenv.Name(t)
	first, err := c.Acquire(ctx, name, 5*time.Second, WithHolder("h"))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reenterStepHook = func() {
		reenterStepHook = nil
		cancel() // the caller gives up between the steps
	}
	t.Cleanup(func() { reenterStepHook = nil })
	if l, err := c.TryAcquire(rctx, name, 5*time.Second, WithHolder("h")); err == nil {
		t.Fatalf("a reentry whose caller gave up between its steps was granted (count %d)", l.Count())
	}
	if st, err := c.Inspect(ctx, name); err != nil || !st.Held || st.Count != 1 {
		t.Fatalf("after a failed reentry: %+v, %v; want held once", st, err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after the holder's only release: %+v, %v; want free", st, err)
	}
}
