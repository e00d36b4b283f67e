// Package clock holds the one way fenced's packages pause: a sleep that a
// context ends early.
package clock

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
