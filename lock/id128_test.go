package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// idCalls wraps a store and counts the refreshes and releases that reach
// it.
type idCalls struct {
	lock.LeaseStore
	calls atomic.Int64
}

func (c *idCalls) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	c.calls.Add(1)
	return c.LeaseStore.Refresh(ctx, name, id, ttl, seq)
}

func (c *idCalls) Release(ctx context.Context, name, id, op string) error {
	c.calls.Add(1)
	return c.LeaseStore.Release(ctx, name, id, op)
}

// TestIDsAreLowercaseHex: lease ids, release ids and waiters are 32
// lowercase hex digits, as this package draws them; the stores compare
// them as strings. An uppercase spelling passed the check (hex.DecodeString
// takes either case) and then named another id: RefreshID of a held
// lease's id in uppercase answered ErrLost, telling the holder to stop
// while it held the lock (docs/design.md, defect 125). It is refused as
// invalid, saying what was wrong, before any store call.
func TestIDsAreLowercaseHex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cs := &idCalls{LeaseStore: etcdBackend(t).store}
	c := newClient(t, cs)
	name := testenv.Name(t)
	l, err := c.TryAcquire(ctx, name, 10*time.Second, lock.WithDetached())
	if err != nil {
		t.Fatal(err)
	}
	id := l.ID()
	if id != strings.ToLower(id) || strings.Trim(id, "0123456789") == "" {
		t.Fatalf("lease id %q: want lowercase hex with a letter (draw again)", id)
	}
	upper := strings.ToUpper(id)

	if _, err := c.RefreshID(ctx, name, upper, 10*time.Second, 0); !errors.Is(err, lock.ErrInvalidLeaseID) || !strings.Contains(err.Error(), "32 lowercase hex digits") || !strings.Contains(err.Error(), "uppercase") {
		t.Errorf("RefreshID with the lease id in uppercase: %v; want ErrInvalidLeaseID saying it wants 32 lowercase hex digits and found uppercase", err)
	}
	if err := c.ReleaseID(ctx, name, upper, ""); !errors.Is(err, lock.ErrInvalidLeaseID) {
		t.Errorf("ReleaseID with the lease id in uppercase: %v; want ErrInvalidLeaseID", err)
	}
	// It read "lock: invalid lease id: release id: …" (defect 209).
	if err := c.ReleaseID(ctx, name, id, upper); !errors.Is(err, lock.ErrInvalidLeaseID) || !strings.HasPrefix(err.Error(), "lock: invalid release id: ") {
		t.Errorf("ReleaseID with an uppercase release id: %v; want ErrInvalidLeaseID naming the release id", err)
	}
	if n := cs.calls.Load(); n != 0 {
		t.Errorf("%d refreshes or releases with an uppercase id reached the store", n)
	}
	for _, f := range []struct {
		what string
		fn   func(string) error
	}{{"ValidateWaiter", lock.ValidateWaiter}, {"ValidateReleaseID", lock.ValidateReleaseID}} {
		if err := f.fn(upper); err == nil || !strings.Contains(err.Error(), "32 lowercase hex digits") {
			t.Errorf("%s(%q): %v; want it refused, wanting 32 lowercase hex digits", f.what, upper, err)
		}
		if err := f.fn(id); err != nil {
			t.Errorf("%s(%q): %v", f.what, id, err)
		}
	}
	if _, err := c.TryAcquire(ctx, name+"-w", time.Second, lock.WithWaiter(upper)); !errors.Is(err, lock.ErrInvalidOption) || !strings.Contains(err.Error(), "lowercase") {
		t.Errorf("WithWaiter in uppercase: %v; want ErrInvalidOption wanting lowercase", err)
	}

	// The lease is untouched, and its own id still refreshes and releases it.
	if g, err := c.RefreshID(ctx, name, id, 10*time.Second, 0); err != nil || g.Token != l.Token() {
		t.Fatalf("RefreshID with the lease id: %+v, %v", g, err)
	}
	if err := c.ReleaseID(ctx, name, id, ""); err != nil {
		t.Fatal(err)
	}
}
