package server

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestActiveLeasesKeepsReenteredLease: a lock its reentrant holder
// acquired twice is still held after one release, and
// fenced_active_leases still counts it; the second release frees it and
// the gauge drops. The gauge used to drop at the first release. A release
// sent again with its release_id takes off no second hold, and the gauge
// follows.
func TestActiveLeasesKeepsReenteredLease(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.store, nil)
			name := testenv.Name(t)
			body := `{"ttl_ms":30000,"holder":"h-secret-1"}`
			l := e.mustAcquire(name, body)
			e.mustAcquire(name, body)
			if v := metric(e.scrape(), "fenced_active_leases"); v != 1 {
				t.Fatalf("fenced_active_leases %v with one lease held twice, want 1", v)
			}
			rel := `{"lease_id":"` + l.LeaseID + `","release_id":"` + strings.Repeat("3c", 16) + `"}`
			for range 2 { // the second as after a lost answer
				if r := e.do("POST", "/v1/locks/"+name+"/release", rel); r.status != http.StatusOK {
					t.Fatalf("release: %d %s", r.status, r.body)
				}
				if st := e.state(name); !st.Held {
					t.Fatalf("one release of a lock held twice freed it: %+v", st)
				}
				if v := metric(e.scrape(), "fenced_active_leases"); v != 1 {
					t.Fatalf("fenced_active_leases %v after one of two holds was released, the lock still held; want 1", v)
				}
			}
			if r := e.release(name, l.LeaseID); r.status != http.StatusOK || e.state(name).Held {
				t.Fatalf("the last release: %d %s", r.status, r.body)
			}
			if v := metric(e.scrape(), "fenced_active_leases"); v != 0 {
				t.Fatalf("fenced_active_leases %v after the last release, want 0", v)
			}
		})
	}
}

// answerHeld is a LeaseStore that, once armed, holds the answer of its
// next Acquire or Refresh (op) after the store applied it, until let is
// closed: the handler of a request the store served is delayed, as a
// loaded server may delay it.
type answerHeld struct {
	lock.LeaseStore
	op      string // opAcquire or opRefresh
	armed   atomic.Bool
	applied chan struct{} // closed when the held call's store operation returned
	let     chan struct{} // closed to let its answer go
}

func newAnswerHeld(s lock.LeaseStore, op string) *answerHeld {
	return &answerHeld{LeaseStore: s, op: op, applied: make(chan struct{}), let: make(chan struct{})}
}

func (h *answerHeld) hold(op string) {
	if op == h.op && h.armed.CompareAndSwap(true, false) {
		close(h.applied)
		<-h.let
	}
}

func (h *answerHeld) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	g, err := h.LeaseStore.Acquire(ctx, req)
	h.hold(opAcquire)
	return g, err
}

func (h *answerHeld) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	g, err := h.LeaseStore.Refresh(ctx, name, id, ttl, seq)
	h.hold(opRefresh)
	return g, err
}

// endBehindAnswer acquires a lock with body through a server whose store
// holds the answer of its next op call, sends the request of that op that
// pending makes from the lease (its path and body), and, with the store's
// work done and its answer held, ends the lease with end (release or
// force-release), answered 200; then it lets the held answer go, which
// must be 200 too. It returns the server and the lock's name.
func endBehindAnswer(t *testing.T, b backend, op, end, body string, pending func(name string, l leaseResponse) (path, body string)) (*env, string) {
	t.Helper()
	h := newAnswerHeld(b.store, op)
	e := newEnv(t, h, nil)
	name := testenv.Name(t)
	l := e.mustAcquire(name, body)
	h.armed.Store(true)
	path, pendingBody := pending(name, l)
	answered := e.send("POST", path, pendingBody)
	<-h.applied
	var r response
	if end == "release" {
		r = e.release(name, l.LeaseID)
	} else {
		r = e.do("DELETE", "/v1/locks/"+name, "")
	}
	if r.status != http.StatusOK {
		t.Fatalf("%s: %d %s", end, r.status, r.body)
	}
	close(h.let)
	if r := <-answered; r.status != http.StatusOK {
		t.Fatalf("%s applied before the %s: %d %s", op, end, r.status, r.body)
	}
	return e, name
}

// TestActiveLeasesRefreshBehindEnd: a refresh the store applied, whose
// handler is delayed until after a release (or a force-release) of the
// same lease was answered, does not put the ended lease back into
// fenced_active_leases. It did, until the lease's TTL ran out (4 of 4,
// both stores): the refresh's handler recorded the lease after the
// release's took it off (docs/design.md, defect 218).
func TestActiveLeasesRefreshBehindEnd(t *testing.T) {
	for _, b := range backends(t) {
		for _, end := range []string{"release", "force-release"} {
			t.Run(b.name+"/"+end, func(t *testing.T) {
				e, name := endBehindAnswer(t, b, opRefresh, end, `{"ttl_ms":30000}`, func(name string, l leaseResponse) (string, string) {
					return "/v1/locks/" + name + "/refresh", `{"lease_id":"` + l.LeaseID + `","ttl_ms":30000}`
				})
				if st := e.state(name); st.Held {
					t.Fatalf("lock held after the %s: %+v", end, st)
				}
				if v := metric(e.scrape(), "fenced_active_leases"); v != 0 {
					t.Fatalf("fenced_active_leases %v: this server answered the %s 200 and the lock is free; want 0", v, end)
				}
			})
		}
	}
}

// TestActiveLeasesReentryBehindForceRelease: a holder's reentry the store
// applied, whose handler is delayed until after a force-release of the
// lock was answered, does not put the force-released lease back into
// fenced_active_leases (a force-release frees the lock whatever its
// holder's count). A reentry behind a plain release is left counted: that
// release only counted the hold down, and the lock is still held.
func TestActiveLeasesReentryBehindForceRelease(t *testing.T) {
	for _, b := range backends(t) {
		for _, end := range []string{"release", "force-release"} {
			t.Run(b.name+"/"+end, func(t *testing.T) {
				body := `{"ttl_ms":30000,"holder":"h-secret-2"}`
				e, name := endBehindAnswer(t, b, opAcquire, end, body, func(name string, _ leaseResponse) (string, string) {
					return "/v1/locks/" + name + "/acquire", body
				})
				want := 0.0
				if e.state(name).Held {
					want = 1
				}
				if end == "release" && want != 1 {
					t.Fatalf("one release of a lock held twice freed it")
				}
				if v := metric(e.scrape(), "fenced_active_leases"); v != want {
					t.Fatalf("fenced_active_leases %v after the %s behind a reentry; the lock held: %v", v, end, want == 1)
				}
			})
		}
	}
}
