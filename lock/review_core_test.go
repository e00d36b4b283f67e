package lock_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fenced/fenced/lock"
)

// TestExponentialBackoffStaysWithinBounds: every backoff lies in
// [3/4 min, max], however many rounds a waiter makes and however large
// the bounds. A fair waiter's sleep is capped at a third of its place's
// TTL, so it calls NextBackoff once a second or more while the strategy's
// own interval keeps doubling: with a max of math.MaxInt64 ("no cap") the
// doubling overflowed after about 40 rounds and the next call panicked in
// rand.Int64N.
func TestExponentialBackoffStaysWithinBounds(t *testing.T) {
	for _, b := range []struct{ min, max time.Duration }{
		{4 * time.Millisecond, math.MaxInt64},
		{time.Second, math.MaxInt64},
		{1 << 62, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
		{4 * time.Millisecond, 256 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(b.min, "-", b.max), func(t *testing.T) {
			s := lock.ExponentialBackoff(b.min, b.max)
			for i := range 200 {
				var d time.Duration
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Fatalf("round %d: NextBackoff panicked: %v", i, p)
						}
					}()
					d = s.NextBackoff()
				}()
				if d < b.min-b.min/4 || d > b.max {
					t.Fatalf("round %d: backoff %s; want %s to %s", i, d, b.min-b.min/4, b.max)
				}
			}
		})
	}
}
