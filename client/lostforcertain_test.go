package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestReleaseOfALeaseLostForCertainIsLost: a release whose first attempt
// got no answer, of a lease that another took away before it (a
// force-release here; a Redis restart, a failover), answered 410 by a
// store that is sure the lease was gone before (Redis leases: its list of
// released ids has room and lacks this one). The client forgave every
// "lost" after an unanswered attempt, as perhaps its own earlier release,
// and Release said nil to a holder whose lock another may have held
// (docs/design.md, defect 190). The server now says which (the 410's
// maybe_released), and the client forgives only the unsure one: in one
// call (the first attempt held by one server, the second answered by
// another) and in a second call after a first that failed.
func TestReleaseOfALeaseLostForCertainIsLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p0, u0 := behindProxy(t, f.url)
	c := newClient(t, u0+","+f.url)
	ctx := t.Context()

	t.Run("one call", func(t *testing.T) {
		name := testenv.Name(t)
		l, err := c.Acquire(ctx, name, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.locks.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
		p0.Hold(true)
		defer p0.Hold(false)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := l.Release(rctx); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("release of a lease force-released before, its first attempt unanswered: %v; want lock.ErrLost", err)
		}
	})

	// acquire takes a lock of the test's name through a client of its own,
	// behind a proxy of its own.
	acquire := func(t *testing.T) (*faultproxy.Proxy, string, *client.Lease) {
		t.Helper()
		p, u := behindProxy(t, f.url)
		name := testenv.Name(t)
		l, err := newClient(t, u).Acquire(ctx, name, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return p, name, l
	}

	t.Run("second call", func(t *testing.T) {
		p1, name, l := acquire(t)
		p1.Hold(true)
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := l.Release(rctx) // held, then cut by the deadline
		cancel()
		p1.CutAll() // the release held is never delivered
		p1.Hold(false)
		if err == nil || errors.Is(err, lock.ErrLost) {
			t.Fatalf("a release that got no answer: %v; want an error that is not lost", err)
		}
		if _, err := f.locks.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("release again of a lease force-released since: %v; want lock.ErrLost", err)
		}
	})

	// The unsure "lost" is still forgiven: the lease released by the first
	// attempt, whose answer was lost, and the store's memory of released
	// ids full (16 hand-overs since).
	t.Run("unsure", func(t *testing.T) {
		p1, name, l := acquire(t)
		lost := p1.LoseReplyAndRefuse([]byte("/release"))
		if err := l.Release(ctx); err == nil || errors.Is(err, lock.ErrLost) {
			t.Fatalf("a release whose answer was lost, the server then unreachable: %v; want an error that is not lost", err)
		}
		select {
		case <-lost:
		case <-time.After(10 * time.Second):
			t.Fatal("the release never reached the proxy")
		}
		p1.Refuse(false)
		for range 17 {
			o, err := f.locks.TryAcquire(ctx, name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release again after 17 hand-overs of a lease its first release freed: %v; want nil", err)
		}
	})
}
