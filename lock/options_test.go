package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestOptionsThatDoNotApply: an option that does not apply to the call is
// an error that says what is allowed, and nothing reaches the store.
func TestOptionsThatDoNotApply(t *testing.T) {
	t.Parallel()
	cs := &counting{LeaseStore: etcdBackend(t).store}
	c := newClient(t, cs)
	ctx := t.Context()
	name := testenv.Name(t)
	for _, tc := range []struct {
		call string
		opts []lock.Option
		want string
	}{
		{"try", []lock.Option{lock.WithWait(time.Second)}, "WithWait does not apply to TryAcquire"},
		{"try", []lock.Option{lock.WithWait(0)}, "WithWait does not apply to TryAcquire"},
		{"try", []lock.Option{lock.WithRetry(lock.NoRetry())}, "WithRetry does not apply to TryAcquire"},
		{"try", []lock.Option{lock.WithDetached(), lock.WithKeepAlive()}, "WithDetached and WithKeepAlive together"},
		{"acquire", []lock.Option{lock.WithKeepAlive(), lock.WithDetached()}, "WithDetached and WithKeepAlive together"},
		{"acquire", []lock.Option{lock.WithWait(-time.Second)}, "want >= 0"},
		{"acquire", []lock.Option{lock.WithRetry(nil)}, "WithRetry(nil)"},
		// Before, the first panicked in Acquire on a held lock and the
		// next three gave up at once whatever the wait (docs/design.md,
		// defect 198); the last two were quietly changed.
		{"acquire", []lock.Option{lock.WithRetry(lock.LimitRetry(nil, 3))}, "LimitRetry(nil, 3): want a strategy"},
		{"acquire", []lock.Option{lock.WithRetry(lock.LimitRetry(lock.LinearBackoff(time.Millisecond), -1))}, "want max >= 0"},
		{"acquire", []lock.Option{lock.WithRetry(lock.LinearBackoff(0))}, "LinearBackoff(0s): want an interval > 0"},
		{"acquire", []lock.Option{lock.WithRetry(lock.LimitRetry(lock.LinearBackoff(-time.Second), 3))}, "LimitRetry: LinearBackoff(-1s)"},
		{"acquire", []lock.Option{lock.WithRetry(lock.ExponentialBackoff(-time.Second, 10*time.Millisecond))}, "want 0 < min <= max"},
		{"acquire", []lock.Option{lock.WithRetry(lock.ExponentialBackoff(time.Second, 10*time.Millisecond))}, "ExponentialBackoff(1s, 10ms)"},
		{"acquire", []lock.Option{nil}, "nil Option"},
		{"try", []lock.Option{lock.WithWaiter("0123456789abcdef0123456789abcdef"), lock.WithFinal()}, "WithFinal applies to a fair acquisition"},
		{"acquire", []lock.Option{lock.WithUnfair(), lock.WithWaiter("0123456789abcdef0123456789abcdef"), lock.WithFinal()}, "no place in the queue to give up"},
		{"acquire", []lock.Option{lock.WithWaiter("0123")}, "4 characters; want 32 lowercase hex digits"},
		{"acquire", []lock.Option{lock.WithWaiter("0123456789abcdef0123456789abcdeg")}, "not hex"},
		{"acquire", []lock.Option{lock.WithFinal()}, "WithFinal applies with WithWaiter"},
	} {
		var err error
		if tc.call == "try" {
			_, err = c.TryAcquire(ctx, name, time.Second, tc.opts...)
		} else {
			_, err = c.Acquire(ctx, name, time.Second, tc.opts...)
		}
		if !errors.Is(err, lock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with %d options: %v, want ErrInvalidOption saying %q", tc.call, len(tc.opts), err, tc.want)
		}
	}
	if n := cs.calls.Load(); n != 0 {
		t.Fatalf("%d calls reached the store", n)
	}
	// The same options on the call they apply to are fine.
	l, err := c.Acquire(ctx, name, time.Second, lock.WithWait(time.Second), lock.WithRetry(lock.NoRetry()), lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for label, o := range map[string]lock.Option{
		"WithWait":   lock.WithWait(time.Second),
		"WithOwner":  lock.WithOwner("billing"),
		"WithHolder": lock.WithHolder("worker-1"),
		"WithUnfair": lock.WithUnfair(),
		"WithWaiter": lock.WithWaiter("00112233445566778899aabbccddeeff"),
	} {
		// These shape an acquisition; Adopt used to drop all but WithWait
		// and WithRetry silently.
		if _, err := c.Adopt(ctx, name, l.ID(), lock.Grant{Token: l.Token(), TTL: time.Second}, time.Now(), o); !errors.Is(err, lock.ErrInvalidOption) {
			t.Fatalf("Adopt with %s: %v, want ErrInvalidOption", label, err)
		}
	}
}

func TestResolveOptions(t *testing.T) {
	s := lock.LinearBackoff(time.Millisecond)
	o, err := lock.ResolveOptions(false, lock.WithWait(time.Second), lock.WithRetry(s), lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	if o != (lock.AcquireOptions{Wait: time.Second, Retry: s, KeepAlive: true}) {
		t.Fatalf("resolved %+v", o)
	}
	o, err = lock.ResolveOptions(true, lock.WithDetached())
	if err != nil || o != (lock.AcquireOptions{Try: true, Detached: true, Unfair: true}) {
		t.Fatalf("resolved %+v, %v", o, err)
	}
}

// keeperOnly is a LeaseKeeper and nothing more: what a Lease needs.
type keeperOnly struct{ k lock.LeaseKeeper }

func (k keeperOnly) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	return k.k.Refresh(ctx, name, id, ttl, seq)
}

func (k keeperOnly) Release(ctx context.Context, name, id, op string) error {
	return k.k.Release(ctx, name, id, op)
}

// TestLeaseSet adopts a lease granted by one client into a set that can
// only refresh and release: keep-alive, Close and ErrClosed work as for a
// Client's own leases.
func TestLeaseSet(t *testing.T) {
	b := redisBackend(t)
	taker := newClient(t, b.store)
	set, err := lock.NewLeaseSet(keeperOnly{b.store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	name := testenv.Name(t)
	start := time.Now()
	d, err := taker.Acquire(ctx, name, b.ttl, lock.WithDetached())
	if err != nil {
		t.Fatal(err)
	}
	l, err := set.Adopt(ctx, name, d.ID(), lock.Grant{Token: d.Token(), TTL: d.TTL()}, start, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	first := l.Deadline()
	testenv.WaitUntil(t, 30*time.Second, func() bool { return l.Deadline().After(first.Add(b.ttl)) }) // kept alive through the keeper
	if err := set.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), lock.ErrReleased) {
		t.Fatalf("Err after Close = %v, want ErrReleased", l.Err())
	}
	if st, err := taker.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after Close: %+v, %v", st, err)
	}
	if _, err := set.Adopt(ctx, name, d.ID(), lock.Grant{Token: d.Token(), TTL: d.TTL()}, time.Now()); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Adopt after Close = %v, want ErrClosed", err)
	}
	// Detached too, by a set or a Client; before, both made the lease
	// (docs/design.md, defect 217).
	closed, err := lock.New(b.store)
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Adopt(ctx, name, d.ID(), lock.Grant{Token: d.Token(), TTL: d.TTL()}, time.Now(), lock.WithDetached()); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Adopt(WithDetached) after the set's Close = %v, want ErrClosed", err)
	}
	if _, err := closed.Adopt(ctx, name, d.ID(), lock.Grant{Token: d.Token(), TTL: d.TTL()}, time.Now(), lock.WithDetached()); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Adopt(WithDetached) after the Client's Close = %v, want ErrClosed", err)
	}
	if _, err := lock.NewLeaseSet(nil); err == nil {
		t.Fatal("NewLeaseSet(nil) accepted")
	}
}
