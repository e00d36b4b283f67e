package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestCutWaitKeepsItsPlace: a wait that fits in one request sends it as
// the last (final). When the network cuts that request's connection while
// it waits, the client asks again with the same waiter, and must find its
// place ahead of a waiter that came after the cut. Before, the server gave
// the place up with the cut request, and the next one queued behind the
// later waiter, in all three clients (docs/design.md, defect 241).
func TestCutWaitKeepsItsPlace(t *testing.T) {
	f := newFixture(t)
	p, cut := f.proxied(t)
	other := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := other.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waiters := func(n int) {
		t.Helper()
		testenv.WaitUntil(t, 30*time.Second, func() bool {
			st, err := f.locks.Inspect(ctx, name)
			return err == nil && st.Waiters == n
		})
	}
	type result struct {
		who string
		l   *lock.Lease
		err error
	}
	got := make(chan result, 2)
	acquire := func(who string, c interface {
		Acquire(ctx context.Context, name string, ttl time.Duration, opts ...lock.Option) (*lock.Lease, error)
	}) {
		l, err := c.Acquire(ctx, name, 10*time.Second, lock.WithWait(20*time.Second))
		got <- result{who, l, err}
	}
	go acquire("cut", cut)
	waiters(1)
	p.Hold(true) // the request sent again waits in the proxy until the later waiter queued
	t.Cleanup(func() { p.Hold(false) })
	p.CutAll()
	// The holder's acquire and the cut one ended at the server.
	testenv.WaitUntil(t, 30*time.Second, func() bool { return f.answered.Load() >= 2 })
	if st, err := f.locks.Inspect(ctx, name); err != nil || st.Waiters != 1 {
		t.Fatalf("after the request was cut: %d waiters (%v), want its place kept", st.Waiters, err)
	}
	go acquire("later", other)
	waiters(2)
	p.Hold(false)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := testenv.Next(t, got)
	if first.err != nil {
		t.Fatal(first.err)
	}
	if first.who != "cut" {
		t.Fatalf("%s got the lock first; want the waiter whose request was cut, which queued first", first.who)
	}
	if err := first.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if second := testenv.Next(t, got); second.err != nil {
		t.Fatal(second.err)
	} else {
		second.l.Release(ctx)
	}
}
