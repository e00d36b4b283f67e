package lock_test

import (
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// A remote acquisition whose grant was lost asks again with its waiter and
// gets the same lease "extended to the TTL asked for" (docs/design.md, "A
// lost answer"): the lease it is handed counts that TTL from the new
// attempt. On Redis leases the script handed the grant back without
// extending it, so the lock expired at the first grant's TTL while its
// holder counted it valid for the new one.
func TestLostGrantFoundAgainIsExtended(t *testing.T) {
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			ctx := t.Context()
			name := testenv.Name(t)
			const w = "00112233445566778899aabbccddeeff"
			remote := []lock.Option{lock.WithWaiter(w), lock.WithWait(time.Second), lock.WithDetached()}
			if _, err := c.Acquire(ctx, name, 5*time.Second, remote...); err != nil {
				t.Fatal(err)
			}
			again, err := c.Acquire(ctx, name, time.Minute, remote...)
			if err != nil {
				t.Fatal(err)
			}
			defer again.Release(ctx)
			st, err := c.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			// The store's expiry comes after the holder's deadline: the
			// holder counts from before its request, the store from after.
			if valid := time.Until(again.Deadline()); !st.Held || st.Remaining < valid {
				t.Fatalf("found again with a TTL of 1m: the lock has %s left in the store (held %v), the holder counts it valid for %s",
					st.Remaining, st.Held, valid.Round(time.Millisecond))
			}
		})
	}
}
