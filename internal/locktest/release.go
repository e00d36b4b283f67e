package locktest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/lock"
)

// RefreshBehindRelease is a LeaseStore on which a refresh is overtaken by
// the release of its lease, as on a slow network: its Refresh waits until
// its Release has been applied (so it is answered "lost"), and its Release
// answers only once the test says that the refresh's caller has its answer
// (Answered). A Lease that loses itself to that "lost" before its Release
// returns says lost after a clean release (docs/design.md, defect 215).
type RefreshBehindRelease struct {
	lock.LeaseStore
	entered, released, answered  chan struct{}
	onEnter, onRelease, onAnswer sync.Once
}

// NewRefreshBehindRelease wraps s.
func NewRefreshBehindRelease(s lock.LeaseStore) *RefreshBehindRelease {
	return &RefreshBehindRelease{LeaseStore: s,
		entered: make(chan struct{}), released: make(chan struct{}), answered: make(chan struct{})}
}

// Entered is closed once a Refresh has reached the store.
func (s *RefreshBehindRelease) Entered() <-chan struct{} { return s.entered }

// Answered lets Release answer: the refresh's caller has its answer.
func (s *RefreshBehindRelease) Answered() { s.onAnswer.Do(func() { close(s.answered) }) }

// Refresh implements lock.LeaseKeeper.
func (s *RefreshBehindRelease) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	s.onEnter.Do(func() { close(s.entered) })
	select {
	case <-s.released:
	case <-ctx.Done():
		return lock.Grant{}, ctx.Err()
	}
	return s.LeaseStore.Refresh(ctx, name, id, ttl, seq)
}

// Release implements lock.LeaseKeeper.
func (s *RefreshBehindRelease) Release(ctx context.Context, name, id, op string) error {
	err := s.LeaseStore.Release(ctx, name, id, op)
	s.onRelease.Do(func() { close(s.released) })
	select {
	case <-s.answered:
	case <-ctx.Done():
	}
	return err
}

// CheckRefreshOvertakenByRelease refreshes l, releases it while the
// refresh waits in s, and fails the test unless Release returns nil and
// both Err and the Refresh say ErrReleased.
func CheckRefreshOvertakenByRelease(t *testing.T, s *RefreshBehindRelease, l *lock.Lease) {
	t.Helper()
	refreshed := make(chan error, 1)
	go func() {
		err := l.Refresh(t.Context(), 0)
		s.Answered()
		refreshed <- err
	}()
	<-s.Entered()
	released := l.Release(t.Context())
	refresh := <-refreshed
	if released != nil || !errors.Is(l.Err(), lock.ErrReleased) || !errors.Is(refresh, lock.ErrReleased) {
		t.Fatalf("Release: %v; Err: %v; the Refresh: %v; want nil, ErrReleased, ErrReleased", released, l.Err(), refresh)
	}
}
