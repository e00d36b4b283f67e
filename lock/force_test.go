package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestForceReleaseIfToken: a force-release with IfToken removes the grant
// with that token and no other, on every store. Sent again once the lock
// has gone to the next holder (an operator's DELETE whose answer was lost
// or was a 503), it leaves that holder alone: the call an unconditional
// force-release cannot safely repeat.
func TestForceReleaseIfToken(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			ctx := t.Context()
			name := testenv.Name(t)
			first, err := c.Acquire(ctx, name, 30*time.Second, lock.WithOwner("stuck-job"), lock.WithDetached())
			if err != nil {
				t.Fatal(err)
			}

			// Another token: nothing released, and the error says who holds it.
			other := first.Token() + 1000
			st, err := c.ForceRelease(ctx, name, lock.IfToken(other))
			var he *lock.HeldByOtherError
			if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeldByOther) || he.Token != first.Token() || he.Want != other {
				t.Fatalf("ForceRelease(IfToken(%d)) of a lock held by token %d: %+v, %v; want a *HeldByOtherError naming %d", other, first.Token(), st, err, first.Token())
			}
			if now, err := c.Inspect(ctx, name); err != nil || !now.Held || now.LeaseID != first.ID() {
				t.Fatalf("after a force-release with another token: %+v, %v; want still held by %s", now, err, first.ID())
			}

			// Its token: released, and the state it had returned.
			type result struct {
				l   *lock.Lease
				err error
			}
			next := make(chan result, 1)
			go func() { // ends by ctx at the latest
				l, err := c.Acquire(ctx, name, 30*time.Second, lock.WithDetached(), lock.WithWait(30*time.Second))
				next <- result{l, err}
			}()
			testenv.WaitUntil(t, 30*time.Second, func() bool { st, err := c.Inspect(ctx, name); return err == nil && st.Waiters == 1 })
			st, err = c.ForceRelease(ctx, name, lock.IfToken(first.Token()))
			if err != nil || !st.Held || st.LeaseID != first.ID() || st.Token != first.Token() || st.Owner != "stuck-job" {
				t.Fatalf("ForceRelease(IfToken(%d)) of the lock it holds: %+v, %v; want the holder removed", first.Token(), st, err)
			}
			if _, err := c.RefreshID(ctx, name, first.ID(), time.Second, 0); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("the removed holder's refresh: %v, want ErrLost", err)
			}

			// Sent again once the woken waiter holds the lock: it stays held.
			r := <-next
			if r.err != nil {
				t.Fatalf("the waiter: %v", r.err)
			}
			second := r.l
			t.Cleanup(func() { second.Release(context.Background()) })
			st, err = c.ForceRelease(ctx, name, lock.IfToken(first.Token()))
			if !errors.As(err, &he) || he.Token != second.Token() {
				t.Fatalf("ForceRelease(IfToken(%d)) again, the lock now held by token %d: %+v, %v; want a *HeldByOtherError naming %d", first.Token(), second.Token(), st, err, second.Token())
			}
			if now, err := c.Inspect(ctx, name); err != nil || !now.Held || now.LeaseID != second.ID() {
				t.Fatalf("the next holder after the conditional force-release was sent again: %+v, %v; want still held by %s", now, err, second.ID())
			}

			// A free lock: not held, no error, as without IfToken.
			if err := second.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if st, err := c.ForceRelease(ctx, name, lock.IfToken(second.Token())); err != nil || st.Held {
				t.Fatalf("ForceRelease(IfToken) of a free lock: %+v, %v; want Held false and no error", st, err)
			}
		})
	}
}

// TestIfTokenValidates: IfToken takes a token fenced can issue.
func TestIfTokenValidates(t *testing.T) {
	c := newClient(t, etcdBackend(t).store)
	for _, tok := range []fence.Token{0, fence.MaxToken + 1} {
		if _, err := c.ForceRelease(t.Context(), testenv.Name(t), lock.IfToken(tok)); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("IfToken(%d): %v, want ErrInvalidOption", uint64(tok), err)
		}
	}
	if _, err := c.ForceRelease(t.Context(), testenv.Name(t), nil); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("a nil ForceOption: %v, want ErrInvalidOption", err)
	}
}
