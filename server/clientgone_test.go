package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// TestClientGoneKeepsWaitersGrant: two servers share the lease store. The
// caller's acquire with a waiter id is answered by B (lease L); a copy of
// the same request reaches A, whose lock client finds L again, and A's
// client has gone by the time it does. A used to release L: the caller
// held a token whose lock was free, and the next caller took it at once.
// A keeps it; a new grant made for a waiter whose client went away it
// releases only if no copy of the request was handed it.
func TestClientGoneKeepsWaitersGrant(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range []struct{ name, body string }{
				{"try", `{"ttl_ms":30000,"waiter":"` + strings.Repeat("ab", 16) + `"}`},
				{"fair", `{"ttl_ms":30000,"wait_ms":1000,"waiter":"` + strings.Repeat("cd", 16) + `"}`},
			} {
				t.Run(c.name, func(t *testing.T) {
					ctx, cancel := context.WithCancel(t.Context())
					eB := newEnv(t, b.store, nil)
					eA := newEnv(t, &hookStore{LeaseStore: b.store, after: cancel}, nil)
					name := testenv.Name(t)
					l := eB.mustAcquire(name, c.body)

					// A's copy: its client is gone once the store has answered.
					rec := eA.acquireAs(ctx, name, c.body)
					if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "kept for the waiter's next request") {
						t.Errorf("the late copy: %d %s; want 503 saying the lease is kept", rec.Code, rec.Body)
					}
					if st := eB.state(name); !st.Held || st.Token != l.Token {
						t.Fatalf("after a late copy of the acquire whose client went away: %+v; want still held with token %d", st, l.Token)
					}
					r := eB.do("POST", "/v1/locks/"+name+"/refresh", `{"lease_id":"`+l.LeaseID+`","ttl_ms":30000}`)
					if r.status != http.StatusOK {
						t.Fatalf("refresh of the caller's lease: %d %s; want it still held", r.status, r.body)
					}
					// The waiter asks again: handed the grant made for it,
					// which the answer says is reused (defect 216).
					if again := eB.mustAcquire(name, c.body); again.LeaseID != l.LeaseID || l.Reused || !again.Reused || again.Count != 0 {
						t.Fatalf("the waiter's first answer %+v, and when it asks again %+v; want the same lease, reused the second time only", l, again)
					}
					if _, r := eB.acquire(name, `{"ttl_ms":30000}`); r.status != http.StatusConflict {
						t.Fatalf("another caller's acquire: %d %s; want 409 held", r.status, r.body)
					}
					if v := metric(eA.scrape(), "fenced_acquisitions_total", "result", "cancelled"); v != 1 {
						t.Fatalf("fenced_acquisitions_total{result=cancelled} %v, want 1", v)
					}
				})
			}

			// A new grant for a waiter whose client went away, handed to
			// nobody, is released (defect 153): left, it would hold the
			// lock, known to nobody, until its TTL.
			t.Run("new grant", func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				eA := newEnv(t, &hookStore{LeaseStore: b.store, after: cancel}, nil)
				eB := newEnv(t, b.store, nil)
				name := testenv.Name(t)
				body := `{"ttl_ms":30000,"waiter":"` + strings.Repeat("ef", 16) + `"}`
				rec := eA.acquireAs(ctx, name, body)
				if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "released") {
					t.Fatalf("acquire whose client went away: %d %s; want 503 saying the lease was released", rec.Code, rec.Body)
				}
				if st := eB.state(name); st.Held {
					t.Fatalf("a grant handed to nobody, its client gone: %+v; want released", st)
				}
			})

			// The same, but a copy of the request, through B, was handed the
			// grant before A saw its client gone: A must leave it (148, 153).
			t.Run("new grant handed first", func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				eB := newEnv(t, b.store, nil)
				name := testenv.Name(t)
				body := `{"ttl_ms":30000,"waiter":"` + strings.Repeat("a1", 16) + `"}`
				var handed leaseResponse
				eA := newEnv(t, &hookStore{LeaseStore: b.store, after: func() {
					handed = eB.mustAcquire(name, body)
					cancel()
				}}, nil)
				rec := eA.acquireAs(ctx, name, body)
				if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "kept") {
					t.Fatalf("acquire whose client went away after a copy was handed its grant: %d %s; want 503 saying it is kept", rec.Code, rec.Body)
				}
				if st := eB.state(name); !st.Held || st.Token != handed.Token {
					t.Fatalf("after A saw its client gone: %+v; want held with the handed grant's token %d", st, handed.Token)
				}
				if r := eB.do("POST", "/v1/locks/"+name+"/refresh", `{"lease_id":"`+handed.LeaseID+`","ttl_ms":30000}`); r.status != http.StatusOK {
					t.Fatalf("refresh of the handed lease: %d %s", r.status, r.body)
				}
			})
		})
	}
}

// TestClientGoneTakesOffReentry: a holder's reentry without a waiter id
// whose client went away is taken off again: one release, which leaves
// the holder's own hold.
func TestClientGoneTakesOffReentry(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			e := newEnv(t, b.store, nil)
			hooked := newEnv(t, &hookStore{LeaseStore: b.store, after: cancel}, nil)
			name := testenv.Name(t)
			body := `{"ttl_ms":30000,"holder":"worker-5c1d9e2f7a3b"}`
			l := e.mustAcquire(name, body)
			rec := hooked.acquireAs(ctx, name, body)
			if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "released") {
				t.Fatalf("reentry whose client went away: %d %s", rec.Code, rec.Body)
			}
			if st := e.state(name); !st.Held || st.Count != 0 || st.Token != l.Token { // count absent for one hold
				t.Fatalf("after the reentry was taken off: %+v; want held once with token %d", st, l.Token)
			}
			if r := e.release(name, l.LeaseID); r.status != http.StatusOK || e.state(name).Held {
				t.Fatalf("the holder's one release: %d %s; want the lock free", r.status, r.body)
			}
		})
	}
}

// TestClientGoneTakesOffWaitersReentry: a holder's reentry with a waiter
// id (every HTTP client sends one) whose client went away was kept as a
// grant found again: after the holder's one release the lock stayed
// held, by nobody, until its TTL (defect 183). Its hold is now taken off,
// unless a copy of the request was handed it first.
func TestClientGoneTakesOffWaitersReentry(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range []struct{ name, wait string }{{"try", ""}, {"fair", `,"wait_ms":1000`}} {
				t.Run(c.name, func(t *testing.T) {
					ctx, cancel := context.WithCancel(t.Context())
					e := newEnv(t, b.store, nil)
					hooked := newEnv(t, &hookStore{LeaseStore: b.store, after: cancel}, nil)
					name := testenv.Name(t)
					l := e.mustAcquire(name, `{"ttl_ms":30000,"holder":"worker-7d2e"}`)
					body := `{"ttl_ms":30000,"holder":"worker-7d2e","waiter":"` + strings.Repeat("c3", 16) + `"` + c.wait + `}`
					rec := hooked.acquireAs(ctx, name, body)
					if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "taken off") {
						t.Fatalf("reentry whose client went away: %d %s; want 503 saying its hold was taken off", rec.Code, rec.Body)
					}
					if st := e.state(name); !st.Held || st.Count != 0 || st.Token != l.Token {
						t.Fatalf("after the reentry was taken off: %+v; want held once with token %d", st, l.Token)
					}
					if r := e.release(name, l.LeaseID); r.status != http.StatusOK || e.state(name).Held {
						t.Fatalf("the holder's one release: %d %s, held %v; want the lock free", r.status, r.body, e.state(name).Held)
					}
				})
			}

			// A copy of the request, through another server, was handed the
			// reentry's hold before this one saw its client gone: the hold is
			// the copy's caller's, and stays.
			t.Run("handed first", func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				e := newEnv(t, b.store, nil)
				name := testenv.Name(t)
				l := e.mustAcquire(name, `{"ttl_ms":30000,"holder":"worker-9a4b"}`)
				body := `{"ttl_ms":30000,"holder":"worker-9a4b","waiter":"` + strings.Repeat("d4", 16) + `"}`
				var handed leaseResponse
				hooked := newEnv(t, &hookStore{LeaseStore: b.store, after: func() {
					handed = e.mustAcquire(name, body)
					cancel()
				}}, nil)
				rec := hooked.acquireAs(ctx, name, body)
				if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "kept") {
					t.Fatalf("reentry whose client went away after a copy was handed its hold: %d %s; want 503 saying it is kept", rec.Code, rec.Body)
				}
				if handed.LeaseID != l.LeaseID || handed.Count != 2 {
					t.Fatalf("the copy's answer: %+v; want lease %s held twice", handed, l.LeaseID)
				}
				if st := e.state(name); st.Count != 2 {
					t.Fatalf("after the first request saw its client gone: %+v; want held twice", st)
				}
				if r := e.release(name, l.LeaseID); r.status != http.StatusOK || !e.state(name).Held {
					t.Fatalf("the first of two releases: %d %s; want the lock still held", r.status, r.body)
				}
				if r := e.release(name, l.LeaseID); r.status != http.StatusOK || e.state(name).Held {
					t.Fatalf("the second release: %d %s; want the lock free", r.status, r.body)
				}
			})
		})
	}
}

// acquireAs sends an acquire of name with body whose request context is
// ctx (which a hookStore may end as the store answers).
func (e *env) acquireAs(ctx context.Context, name, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, "POST", "/v1/locks/"+name+"/acquire", strings.NewReader(body))
	rec := httptest.NewRecorder()
	e.srv.ServeHTTP(rec, req)
	return rec
}

// inProgressStore answers every acquire that an earlier request of the
// acquisition is still taking the lock.
type inProgressStore struct{ lock.LeaseStore }

func (inProgressStore) Acquire(context.Context, lock.AcquireRequest) (lock.Grant, error) {
	return lock.Grant{}, lock.ErrInProgress
}

// Defect 158: a copy of an acquisition's request that meets the first
// still taking its token is a 503, to ask again, not a 409 "held by
// another holder", and no backend error.
func TestAcquireInProgressAsksAgain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, inProgressStore{b.store}, nil)
			_, r := e.acquire(testenv.Name(t), `{"ttl_ms":30000,"waiter":"`+strings.Repeat("b2", 16)+`"}`)
			if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "still taking") {
				t.Fatalf("acquire while a copy is in progress: %d %s; want 503 saying to ask again", r.status, r.body)
			}
			if v := metric(e.scrape(), "fenced_backend_errors_total", "op", "acquire"); v != 0 {
				t.Fatalf("fenced_backend_errors_total{op=acquire} %v, want 0", v)
			}
		})
	}
}
