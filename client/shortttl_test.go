package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestShortTTLThroughTheAPI: the server's 503 about ttl_ms (a grant with
// no validity left) is, to the client, lock.ErrTTLTooShort and
// lock.ErrNotAcquired as lock.Client's error is, and never a held lock's
// *lock.WaitError, in one attempt and at the end of a wait; the one
// attempt sends one request, and the wait asks again.
func TestShortTTLThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := newFixtureOf(t, func(s lock.LeaseStore) lock.LeaseStore {
		return &locktest.SlowAcquire{LeaseStore: s, Delay: 12 * time.Millisecond}
	})
	c := newClient(t, f.url)

	if e := (&client.APIError{Status: 503, Code: api.CodeUnavailable, Field: api.FieldTTLMs}); !errors.Is(e, lock.ErrTTLTooShort) || !errors.Is(e, lock.ErrNotAcquired) {
		t.Fatalf("%+v: want ErrTTLTooShort and ErrNotAcquired", e)
	}
	name := testenv.Name(t)
	_, tryErr := c.TryAcquire(t.Context(), name, lock.MinTTL)
	// The 503 is a decision, the grant released: one attempt is one
	// request, not the client's resends for an undecided answer, which
	// made a TryAcquire take 1.5 s.
	if n := f.acquires.Load(); n != 1 {
		t.Errorf("TryAcquire sent %d acquire requests; want 1", n)
	}
	// A wait longer than one request may ask for asks again, as after a
	// held lock: a later grant may come back in time.
	short := newClient(t, f.url, client.WithMaxRequestWait(100*time.Millisecond))
	_, waitErr := short.Acquire(t.Context(), name, lock.MinTTL, lock.WithWait(300*time.Millisecond))
	if n := f.acquires.Load() - 1; n < 3 {
		t.Errorf("a wait of 300 ms in requests of 100 ms sent %d acquire requests; want 3 or more", n)
	}
	for what, err := range map[string]error{"TryAcquire": tryErr, "Acquire with a wait": waitErr} {
		var we *lock.WaitError
		if !errors.Is(err, lock.ErrTTLTooShort) || !errors.Is(err, lock.ErrNotAcquired) || errors.As(err, &we) {
			t.Errorf("%s: %v (%T): want ErrTTLTooShort and ErrNotAcquired, not a held lock's *WaitError", what, err, err)
		}
	}
	if st, err := c.Inspect(t.Context(), name); err != nil || st.Held {
		t.Fatalf("Inspect: %+v, %v; want the lock free", st, err)
	}
}
