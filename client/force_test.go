package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// heldNext is the lock's next holder: the waiter the force-release woke.
type heldNext struct {
	l   *lock.Lease
	err error
}

// appliedThen starts a proxy in front of the fixture's server that
// forwards every request, and answers the first DELETE with fail once the
// server has applied it and the waiter it woke holds the lock (the result
// of that waiter's Acquire comes on woken and goes on to got). It returns
// the proxy's URL.
func appliedThen(t *testing.T, f *fixture, woken <-chan heldNext, got chan<- heldNext, fail http.HandlerFunc) string {
	t.Helper()
	target, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	var deletes atomic.Int64
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete || deletes.Add(1) > 1 {
			forward.ServeHTTP(w, r)
			return
		}
		applied := httptest.NewRecorder()
		forward.ServeHTTP(applied, r)
		if applied.Code == http.StatusOK {
			got <- <-woken // the next holder has the lock before the answer goes out
		} else {
			got <- heldNext{err: errors.New("the first DELETE answered " + applied.Body.String())}
		}
		fail(w, r)
	}))
	t.Cleanup(ps.Close)
	return ps.URL
}

// answer503 is a server whose backend applied the request and then timed out.
func answer503(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte(`{"error":{"code":"unavailable","message":"lease store: context deadline exceeded"}}`))
}

// forceWithAWaiter has the fixture hold name, with another waiting, and
// returns the first holder's lease and the channel of the waiter's result.
func forceWithAWaiter(t *testing.T, f *fixture, c *client.Client, name string) (*lock.Lease, <-chan heldNext) {
	t.Helper()
	ctx := t.Context()
	first, err := f.locks.TryAcquire(ctx, name, time.Minute, lock.WithDetached())
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan heldNext, 1)
	go func() { // ends by ctx at the latest
		l, err := f.locks.Acquire(ctx, name, time.Minute, lock.WithDetached(), lock.WithWait(30*time.Second))
		next <- heldNext{l, err}
	}()
	waitsLonger(t, c, name, 0, next)
	return first, next
}

// TestForceReleaseAnswered503IsNotSentAgain: a server may answer 503 after
// its backend applied a force-release (the call timed out after it was
// done). The client sent the DELETE again, as after any 503, and the
// second one released the next holder, the waiter the first one woke,
// whom nobody had asked to remove. Now an unconditional force-release
// answered 503 is not sent again, and the error says the lock may have
// been released.
func TestForceReleaseAnswered503IsNotSentAgain(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	name := testenv.Name(t)
	_, woken := forceWithAWaiter(t, f, newClient(t, f.url), name)
	got := make(chan heldNext, 1)
	c := newClient(t, appliedThen(t, f, woken, got, answer503))

	st, err := c.ForceRelease(ctx, name)
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	defer r.l.Release(context.WithoutCancel(ctx))
	if now, ierr := f.locks.Inspect(ctx, name); ierr != nil || !now.Held || now.Token != r.l.Token() {
		t.Fatalf("the next holder (token %d) after one force-release answered 503: %+v, %v; want it still held: the DELETE was sent again", r.l.Token(), now, ierr)
	}
	if err == nil || !strings.Contains(err.Error(), "may have released the lock") {
		t.Errorf("ForceRelease answered 503: %+v, %v; want an error saying the lock may have been released", st, err)
	}
}
