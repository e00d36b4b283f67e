// Package locktest holds lease-store doubles shared by the tests of the
// packages built on lock (lock's own external tests, client, server). It
// imports lock, so lock's internal tests cannot use it; internal/testenv,
// which they use, does not.
package locktest

import (
	"context"
	"time"

	"github.com/fenced/fenced/lock"
)

// SlowAcquire is a LeaseStore whose Acquire answers Delay after the store
// did, as an etcd fsyncing to a cloud disk or a Redis a few milliseconds
// away does: a TTL shorter than Delay always runs out before its grant
// comes back (docs/design.md, defect 182).
type SlowAcquire struct {
	lock.LeaseStore
	Delay time.Duration
}

// Acquire implements lock.LeaseStore.
func (s *SlowAcquire) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	g, err := s.LeaseStore.Acquire(ctx, req)
	time.Sleep(s.Delay) // latency added, not a wait for another goroutine
	return g, err
}
