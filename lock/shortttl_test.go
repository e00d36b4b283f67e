package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// checkTTLTooShort fails t unless err says the TTL ran out before the
// grant: ErrTTLTooShort and ErrNotAcquired, not a *HeldError, and a
// message that names the TTL and what to do.
func checkTTLTooShort(t *testing.T, err error, ttl time.Duration) {
	t.Helper()
	var held *lock.HeldError
	var we *lock.WaitError
	switch {
	case !errors.Is(err, lock.ErrTTLTooShort):
		t.Fatalf("err = %v, want ErrTTLTooShort", err)
	case !errors.Is(err, lock.ErrNotAcquired):
		t.Fatalf("err = %v, want it to match ErrNotAcquired too", err)
	case errors.As(err, &held), errors.As(err, &we):
		t.Fatalf("err = %v (%T), a held lock's error for a free one", err, err)
	case !strings.Contains(err.Error(), "TTL ("+ttl.String()+")") || !strings.Contains(err.Error(), "ask for a TTL"):
		t.Fatalf("message %q: want the TTL (%s) and what to do", err, ttl)
	}
}

// TestTTLTooShortIsNotHeld: a grant that comes back with no validity left
// is released, and the acquisition says its TTL was too short, not that
// the lock is held; nobody holds it. A wait keeps trying, and at its end
// says the same.
func TestTTLTooShortIsNotHeld(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := &locktest.SlowAcquire{LeaseStore: b.store, Delay: 12 * time.Millisecond}
			c := newClient(t, s)
			name := testenv.Name(t)
			_, err := c.TryAcquire(t.Context(), name, lock.MinTTL)
			checkTTLTooShort(t, err, lock.MinTTL)
			_, err = c.Acquire(t.Context(), name, lock.MinTTL, lock.WithWait(150*time.Millisecond))
			checkTTLTooShort(t, err, lock.MinTTL)
			if st, err := c.Inspect(t.Context(), name); err != nil || st.Held {
				t.Fatalf("Inspect: %+v, %v; want the lock free", st, err)
			}
		})
	}
}

// TestHeldShortTTLStillHeld: a lock another holder has is ErrNotAcquired,
// "held" (a *WaitError after a wait), whatever the TTL asked for: not
// ErrTTLTooShort.
func TestHeldShortTTLStillHeld(t *testing.T) {
	t.Parallel()
	b := redisBackend(t)
	c := newClient(t, b.store)
	name := testenv.Name(t)
	if _, err := c.Acquire(t.Context(), name, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := c.TryAcquire(t.Context(), name, lock.MinTTL)
	if !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrTTLTooShort) || !strings.Contains(err.Error(), "is held") {
		t.Fatalf("TryAcquire: err = %v, want ErrNotAcquired (held), not ErrTTLTooShort", err)
	}
	_, err = c.Acquire(t.Context(), name, lock.MinTTL, lock.WithWait(50*time.Millisecond))
	var we *lock.WaitError
	if !errors.As(err, &we) || errors.Is(err, lock.ErrTTLTooShort) {
		t.Fatalf("Acquire with a wait: err = %v, want a *WaitError, not ErrTTLTooShort", err)
	}
}

// lostAfter answers every acquire ErrLost after delay, as a store whose
// lease went while its token was taken does.
type lostAfter struct {
	lock.LeaseStore
	delay time.Duration
}

func (s *lostAfter) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	time.Sleep(s.delay)
	return lock.Grant{}, lock.ErrLost
}

// TestTTLTooShortLostAtConfirm: ErrLost from an attempt that took the TTL
// less its drift is the TTL running out too (no grant could have had
// validity left); a quicker one is not (a restore, a force-release: a
// longer TTL would not help), and stays as it was.
func TestTTLTooShortLostAtConfirm(t *testing.T) {
	t.Parallel()
	b := redisBackend(t)
	name := testenv.Name(t)
	slow := newClient(t, &lostAfter{LeaseStore: b.store, delay: 12 * time.Millisecond})
	_, err := slow.TryAcquire(t.Context(), name, lock.MinTTL)
	checkTTLTooShort(t, err, lock.MinTTL)
	quick := newClient(t, &lostAfter{LeaseStore: b.store})
	_, err = quick.TryAcquire(t.Context(), name, time.Second)
	if !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrTTLTooShort) {
		t.Fatalf("ErrLost at once with a 1s TTL: %v, want ErrNotAcquired, not ErrTTLTooShort", err)
	}
}
