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

// loseAnswer closes the connection instead of answering.
func loseAnswer(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil { // an answer the client takes for a bug, not a lost one
		http.Error(w, "cannot hijack: "+err.Error(), http.StatusInternalServerError)
		return
	}
	conn.Close()
}

// forceWithAWaiter has the fixture hold name, with another waiting, and
// returns the first holder's token and the channel of the waiter's result.
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

// TestForceReleaseWithTokenIsSentAgain: with lock.IfToken, a force-release
// answered 503, or whose answer was lost, is sent again, and the second
// request leaves the next holder alone: it answers that another token
// holds the lock (a *lock.HeldByOtherError naming it). Without a fault it
// releases the lock for that token only.
func TestForceReleaseWithTokenIsSentAgain(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	plain := newClient(t, f.url)

	for _, fault := range []struct {
		name  string
		fault http.HandlerFunc
	}{{"503", answer503}, {"lost answer", loseAnswer}} {
		t.Run(fault.name, func(t *testing.T) {
			name := testenv.Name(t)
			first, woken := forceWithAWaiter(t, f, plain, name)
			got := make(chan heldNext, 1)
			c := newClient(t, appliedThen(t, f, woken, got, fault.fault))
			st, err := c.ForceRelease(ctx, name, lock.IfToken(first.Token()))
			r := <-got
			if r.err != nil {
				t.Fatalf("the waiter: %v", r.err)
			}
			defer r.l.Release(context.WithoutCancel(ctx))
			wantHeldByNext(t, f, name, st, err, r.l)
		})
	}

	t.Run("no fault", func(t *testing.T) {
		name := testenv.Name(t)
		l, err := f.locks.TryAcquire(ctx, name, time.Minute, lock.WithDetached(), lock.WithOwner("stuck"))
		if err != nil {
			t.Fatal(err)
		}
		st, err := plain.ForceRelease(ctx, name, lock.IfToken(l.Token()+1000))
		var he *lock.HeldByOtherError
		if !errors.As(err, &he) || he.Token != l.Token() || he.Want != l.Token()+1000 {
			t.Fatalf("ForceRelease with another token: %+v, %v; want a *lock.HeldByOtherError naming %d", st, err, l.Token())
		}
		if st, err := plain.ForceRelease(ctx, name, lock.IfToken(l.Token())); err != nil || !st.Held || st.Token != l.Token() || st.Owner != "stuck" {
			t.Fatalf("ForceRelease with the holder's token: %+v, %v; want it released", st, err)
		}
		if st, err := plain.ForceRelease(ctx, name, lock.IfToken(l.Token())); err != nil || st.Held {
			t.Fatalf("ForceRelease with the token of a free lock: %+v, %v; want Held false", st, err)
		}
		if _, err := plain.ForceRelease(ctx, name, lock.IfToken(0)); !errors.Is(err, lock.ErrInvalidOption) {
			t.Fatalf("IfToken(0): %v, want lock.ErrInvalidOption", err)
		}
	})
}

// wantHeldByNext checks that a conditional force-release sent again left
// the next holder next with the lock, and said that its token holds it.
func wantHeldByNext(t *testing.T, f *fixture, name string, st lock.State, err error, next *lock.Lease) {
	t.Helper()
	if now, ierr := f.locks.Inspect(t.Context(), name); ierr != nil || !now.Held || now.Token != next.Token() {
		t.Fatalf("the next holder (token %d) after a conditional force-release sent again: %+v, %v; want it still held", next.Token(), now, ierr)
	}
	var he *lock.HeldByOtherError
	if !errors.As(err, &he) || he.Token != next.Token() {
		t.Errorf("ForceRelease(IfToken) sent again: %+v, %v; want a *lock.HeldByOtherError naming the next holder's token %d", st, err, next.Token())
	}
}
