package lock_test

import (
	"testing"
	"time"

	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
)

// TestRefreshOvertakenByRelease: a Refresh in flight while the lease is
// released reaches the store after the release and hears "lost" before
// Release returns. The lease is released, not lost: Release returns nil,
// Err is ErrReleased from its first call on, and the Refresh returns Err.
// Before, the Refresh lost the lease first, and a holder that checked Err
// after a clean release read ErrLost (docs/design.md, defect 215).
func TestRefreshOvertakenByRelease(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := locktest.NewRefreshBehindRelease(b.store)
			l, err := newClient(t, s).Acquire(t.Context(), testenv.Name(t), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			locktest.CheckRefreshOvertakenByRelease(t, s, l)
		})
	}
}
