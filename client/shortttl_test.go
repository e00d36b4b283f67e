package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/fenced/fenced/server"
)

// delayedAcquire adds delay to every acquire call, after the store
// answered: a 10ms TTL always runs out before its grant comes back.
type delayedAcquire struct {
	lock.LeaseStore
	delay time.Duration
}

func (s *delayedAcquire) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	g, err := s.LeaseStore.Acquire(ctx, req)
	time.Sleep(s.delay)
	return g, err
}

// TestShortTTLThroughTheAPI: the server's 503 about ttl_ms (a grant with
// no validity left) is, to the client, lock.ErrTTLTooShort and
// lock.ErrNotAcquired as lock.Client's error is, and never a held lock's
// *lock.WaitError, in one attempt and at the end of a wait.
func TestShortTTLThroughTheAPI(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	_, cli := testenv.Etcd(t)
	seq, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	store, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	locks, err := lock.New(&delayedAcquire{LeaseStore: store, delay: 12 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locks.Close(context.Background()) })
	srv, err := server.New(server.Config{Locks: locks})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	c := newClient(t, hs.URL)

	if e := (&client.APIError{Status: 503, Code: api.CodeUnavailable, Field: api.FieldTTLMs}); !errors.Is(e, lock.ErrTTLTooShort) || !errors.Is(e, lock.ErrNotAcquired) {
		t.Fatalf("%+v: want ErrTTLTooShort and ErrNotAcquired", e)
	}
	name := testenv.Name(t)
	_, tryErr := c.TryAcquire(t.Context(), name, lock.MinTTL)
	_, waitErr := c.Acquire(t.Context(), name, lock.MinTTL, lock.WithWait(300*time.Millisecond))
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
