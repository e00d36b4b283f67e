package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// errRefused is what the store below answers once it cannot be reached:
// a request that did not reach the store and will not if sent again
// (package client's, when the TLS handshake fails on a certificate).
var errRefused = fmt.Errorf("test: %w (the handshake failed on a certificate)", lock.ErrCannotSend)

// unsendable is a store whose refreshes and releases, once cut, fail
// before they reach it with errRefused, as package client's keeper does
// when the server's certificate is no longer trusted.
type unsendable struct {
	lock.LeaseStore
	cut                 atomic.Bool
	refreshes, releases atomic.Int64 // refused
}

func (s *unsendable) Refresh(ctx context.Context, name, leaseID string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	if s.cut.Load() {
		s.refreshes.Add(1)
		return lock.Grant{}, errRefused
	}
	return s.LeaseStore.Refresh(ctx, name, leaseID, ttl, seq)
}

func (s *unsendable) Release(ctx context.Context, name, leaseID, op string) error {
	if s.cut.Load() {
		s.releases.Add(1)
		return errRefused
	}
	return s.LeaseStore.Release(ctx, name, leaseID, op)
}

// TestKeepAliveGivesUpARefreshThatCannotBeSent: a keep-alive refresh that
// fails with ErrCannotSend loses the lease at once, saying why, rather
// than being tried again until the deadline: no refresh will be sent
// before then. Before, it was retried every ttl/10 and the holder learned
// at the deadline, with ErrExpired alone.
func TestKeepAliveGivesUpARefreshThatCannotBeSent(t *testing.T) {
	t.Parallel()
	s := &unsendable{LeaseStore: redisStore(t, testenv.Redis(t))}
	c := newClient(t, s)
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := c.Acquire(ctx, name, 3*time.Second, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	s.cut.Store(true)
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease is not done 10s after its refreshes stopped being sent")
	}
	lost := l.Err()
	switch {
	case errors.Is(lost, lock.ErrExpired):
		t.Fatalf("Err: %v after %d refreshes refused; want the lease given up at the first, before its deadline, not ErrExpired", lost, s.refreshes.Load())
	case !errors.Is(lost, lock.ErrLost) || !errors.Is(lost, errRefused):
		t.Fatalf("Err: %v; want ErrLost and the keeper's error", lost)
	case !strings.Contains(lost.Error(), "stays held in the store until its TTL runs out"):
		t.Fatalf("Err: %q; want it to say the store still holds the lock", lost)
	case s.refreshes.Load() != 1:
		t.Fatalf("%d refreshes refused, want 1: one that cannot be sent is not tried again", s.refreshes.Load())
	}
	// The store holds it, as said, until its TTL.
	if st, err := c.Inspect(ctx, name); err != nil || !st.Held {
		t.Fatalf("Inspect: %+v, %v; want the lock still held in the store", st, err)
	}
	// Release says the lease was lost before it.
	if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) || !errors.Is(err, errRefused) {
		t.Fatalf("Release: %v; want the loss: ErrLost with the keeper's error", err)
	}
}

// TestReleaseThatCannotBeSentWasNotApplied: a release that fails with
// ErrCannotSend says that the lock stays held until its TTL, and counts as
// no attempt that may have been applied: a later release answered "lost,
// maybe released" (the store's memory of released ids full) is a loss,
// not taken for the answer to its own release. Before, the refused
// release counted as unanswered, and the later one returned nil for a
// lease that had been force-released.
func TestReleaseThatCannotBeSentWasNotApplied(t *testing.T) {
	t.Parallel()
	s := &unsendable{LeaseStore: redisStore(t, testenv.Redis(t))}
	c := newClient(t, s)
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := c.Acquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s.cut.Store(true)
	err = l.Release(ctx)
	if !errors.Is(err, lock.ErrCannotSend) || errors.Is(err, lock.ErrLost) || errors.Is(err, lock.ErrMaybeReleased) {
		t.Fatalf("Release: %v; want ErrCannotSend and no other mark", err)
	}
	if !strings.Contains(err.Error(), "stays held in the store until its TTL runs out") {
		t.Errorf("Release: %q; want it to say the lock stays held", err) // and go on
	}
	s.cut.Store(false)
	// Meanwhile an operator force-releases the lock, and 16 holders come
	// and go: the store's memory of released lease ids is full, and it
	// can no longer tell that this lease was not released by its holder.
	if _, err := c.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	for range 16 {
		o, err := c.TryAcquire(ctx, name, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Release after the lock was force-released: %v; want ErrLost: the first release reached no store, so the lease was lost before any release of its holder", err)
	}
}
