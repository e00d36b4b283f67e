package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
)

// tokensIssued reads fenced_tokens_issued_total from a server's metrics.
func tokensIssued(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^fenced_tokens_issued_total (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no fenced_tokens_issued_total in the metrics")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestWaitLongerThanTTL: a waiter that waited on the server longer than
// the TTL it asked for keeps the lease it was granted. Its validity runs
// from the granting attempt (the server says how long it waited first),
// not from when the request was sent, which would make the grant look
// expired on arrival: the client released it and queued again, and in a
// queue every waiter did so in turn (seen: `fenced elect` with a 5s TTL
// behind a paused leader took its term twice).
func TestWaitLongerThanTTL(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := c.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	before := tokensIssued(t, f.url)
	got := make(chan *lock.Lease, 1)
	failed := make(chan error, 1)
	go func() {
		l, err := c.Acquire(context.Background(), name, 300*time.Millisecond, lock.WithWait(30*time.Second))
		if err != nil {
			failed <- err
			return
		}
		got <- l
	}()
	for { // the waiter has waited longer than its TTL
		st, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Waiters == 1 && st.OldestWait > time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
	releasing := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var l *lock.Lease
	select {
	case l = <-got:
	case err := <-failed:
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if n := tokensIssued(t, f.url) - before; n != 1 {
		t.Fatalf("%d tokens issued for one waiting acquire: the client gave back its grant and queued again", n)
	}
	// Granted after the release began, for 300ms less drift.
	if !l.Deadline().After(releasing.Add(200 * time.Millisecond)) {
		t.Fatalf("the lease's deadline is %s after the release began; a 300ms grant made after it lasts longer", l.Deadline().Sub(releasing))
	}
}

// TestLongWaitKeepsItsPlace: a wait longer than one request (here 200 ms
// a request) keeps its place in the queue across its requests. Waiter A
// queues first and B second, B in one long request; A's requests end and
// begin again meanwhile; when the holder releases, A gets the lock first.
// Before, each of A's requests queued anew, behind B: a Go client waiting
// longer than 30 s (its default request) went to the back of the queue
// every 30 s, and a queue longer than that starved it.
func TestLongWaitKeepsItsPlace(t *testing.T) {
	f := newFixture(t)
	long := newClient(t, f.url, client.WithMaxRequestWait(200*time.Millisecond))
	other := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := other.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan waited, 2)
	go waitFor(ctx, got, "A", long, name)
	f.waiters(t, name, 1)
	go waitFor(ctx, got, "B", other, name)
	f.waiters(t, name, 2)
	for n := f.acquires.Load(); f.acquires.Load() < n+2; { // A asked again after B queued
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
	servedInOrder(t, holder, got, "A", "B")
}

// TestCutWaitKeepsItsPlace: a wait that fits in one request sends it as
// the last (final). When the network cuts that request's connection while
// it waits, the client asks again with the same waiter, and must find its
// place ahead of a waiter that came after the cut. Before, the server gave
// the place up with the cut request, and the next one queued behind the
// later waiter, in all three clients (docs/design.md, defect 241).
func TestCutWaitKeepsItsPlace(t *testing.T) {
	f := newFixture(t)
	p, cut := f.proxied(t)
	other := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := other.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan waited, 2)
	go waitFor(ctx, got, "cut", cut, name)
	f.waiters(t, name, 1)
	p.Hold(true) // the request sent again waits in the proxy until the later waiter queued
	t.Cleanup(func() { p.Hold(false) })
	p.CutAll()
	// The holder's acquire and the cut one ended at the server.
	testenv.WaitUntil(t, 30*time.Second, func() bool { return f.answered.Load() >= 2 })
	if st, err := f.locks.Inspect(ctx, name); err != nil || st.Waiters != 1 {
		t.Fatalf("after the request was cut: %d waiters (%v), want its place kept", st.Waiters, err)
	}
	go waitFor(ctx, got, "later", other, name)
	f.waiters(t, name, 2)
	p.Hold(false)
	servedInOrder(t, holder, got, "cut", "later")
}

// waited is the outcome of a waiting acquisition, by who asked.
type waited struct {
	who string
	l   *lock.Lease
	err error
}

// waitFor sends the outcome of who's waiting acquisition of name to got.
func waitFor(ctx context.Context, got chan<- waited, who string, c *client.Client, name string) {
	l, err := c.Acquire(ctx, name, 10*time.Second, lock.WithWait(20*time.Second))
	got <- waited{who, l, err}
}

// waiters waits until name's queue holds n waiters.
func (f *fixture) waiters(t *testing.T, name string, n int) {
	t.Helper()
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := f.locks.Inspect(t.Context(), name)
		return err == nil && st.Waiters == n
	})
}

// servedInOrder releases holder and wants the waiters on got served in
// the order of whos, each releasing the lock to the next.
func servedInOrder(t *testing.T, holder *lock.Lease, got <-chan waited, whos ...string) {
	t.Helper()
	if err := holder.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, want := range whos {
		r := testenv.Next(t, got)
		if r.err != nil {
			t.Fatalf("%s: %v", r.who, r.err)
		}
		if r.who != want {
			t.Fatalf("%s got the lock at turn %d; want %s: the order of the queue is %q", r.who, i+1, want, whos)
		}
		if err := r.l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLostAnswerFindsItsGrant: the answer to an acquire that the server
// granted is lost on its way (the connection cut after the request); the
// client asks again with the same waiter id and gets that grant, the same
// lease and token, with no second token taken. Before, a single server's
// client failed with the connection's error, and one of several servers'
// clients waited behind its own lease until its TTL ran out.
func TestLostAnswerFindsItsGrant(t *testing.T) {
	f := newFixture(t)
	pr, c := f.proxied(t)
	ctx := t.Context()
	name := testenv.Name(t)
	fired := pr.LoseReply([]byte("/acquire"))
	l, err := c.Acquire(ctx, name, 30*time.Second, lock.WithWait(10*time.Second))
	if err != nil {
		t.Fatalf("acquire whose first answer was lost: %v", err)
	}
	select {
	case <-fired:
	default:
		t.Fatal("the fault did not fire: no answer was lost")
	}
	st, err := f.locks.Inspect(ctx, name)
	if err != nil || !st.Held || st.LeaseID != l.ID() || st.Token != l.Token() {
		t.Fatalf("the store holds %+v (%v); the client got lease %s token %d: want the same", st, err, l.ID(), l.Token())
	}
	// The server answered twice: the grant whose answer was lost, and the
	// same again.
	answers := f.granted()
	if len(answers) != 2 {
		t.Fatalf("%d grants answered, want 2: %q", len(answers), answers)
	}
	var first, second api.Lease
	if json.Unmarshal([]byte(answers[0]), &first) != nil || json.Unmarshal([]byte(answers[1]), &second) != nil ||
		first.LeaseID != l.ID() || first.Token != l.Token() || second.LeaseID != l.ID() {
		t.Fatalf("answers %q; the client got lease %s token %d: want the lost grant's lease both times", answers, l.ID(), l.Token())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := f.locks.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("after the release: %+v, %v", st, err)
	}
}

// A wait that ends held leaves the queue with its last request: a client
// that gave up does not keep a free lock from those behind it. Its last
// request's place was kept 3 s for a next request that never came, so a
// free lock answered 409 "held" meanwhile. A wait longer than one request
// still keeps its place between them (TestLongWaitKeepsItsPlace).
func TestEndedWaitLeavesTheQueue(t *testing.T) {
	f := newFixture(t)
	split := newClient(t, f.url, client.WithMaxRequestWait(100*time.Millisecond))
	c := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := c.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*client.Client{c, split} {
		if _, err := w.Acquire(ctx, name, 10*time.Second, lock.WithWait(250*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("a wait on a held lock: %v", err)
		}
		if st, err := c.Inspect(ctx, name); err != nil || st.Waiters != 0 {
			t.Fatalf("after the wait ended: %+v, %v; want no waiters", st, err)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// heldName is a new lock name, held 30 s through the fixture's lock
// client until the test ends.
func (f *fixture) heldName(t *testing.T) string {
	t.Helper()
	name := testenv.Name(t)
	holder, err := f.locks.TryAcquire(t.Context(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Release(context.Background()) })
	return name
}

// waitWaiters waits until lock name has n waiters, within d.
func (f *fixture) waitWaiters(t *testing.T, name string, n int, d time.Duration) {
	t.Helper()
	testenv.WaitUntil(t, d, func() bool {
		st, err := f.locks.Inspect(t.Context(), name)
		return err == nil && st.Waiters == n
	})
}

// seeingAcquires is a server that shows see each acquire request's body
// (an api.AcquireRequest) before pass gets the request, if see says so.
func seeingAcquires(t *testing.T, pass http.Handler, see func(api.AcquireRequest, *http.Request) bool) string {
	t.Helper()
	url, _ := counted(t, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req api.AcquireRequest
		if strings.HasSuffix(r.URL.Path, "/acquire") && json.Unmarshal(body, &req) == nil && !see(req, r) {
			return
		}
		pass.ServeHTTP(w, r)
	})
	return url
}

// A wait that ends after a request that was not final (its answer came
// late, after the wait was over) gives its place up with one more
// request, final and of 1 ms. Before, the client returned at once and the
// server kept the place 3 s for a next request that never came, a free
// lock answered "held" to everyone behind it meanwhile; CI met it when a
// loaded machine delayed the answers of TestEndedWaitLeavesTheQueue's
// split wait (docs/design.md, defect 128).
func TestWaitEndedAfterARequestLeavesTheQueue(t *testing.T) {
	f := newFixture(t)
	const wait = 300 * time.Millisecond
	var end atomic.Int64 // when the wait ends, in Unix nanoseconds
	var late atomic.Bool
	var bodies []api.AcquireRequest
	var mu sync.Mutex
	pass, _ := passOn(t, f, 0)
	pass.ModifyResponse = func(r *http.Response) error {
		if r.StatusCode == http.StatusConflict && late.CompareAndSwap(false, true) {
			// The first "held" reaches the client after its wait is over,
			// as a slow network or a loaded machine delivers it.
			time.Sleep(time.Until(time.Unix(0, end.Load())) + 10*time.Millisecond)
		}
		return nil
	}
	url := seeingAcquires(t, pass, func(req api.AcquireRequest, _ *http.Request) bool {
		mu.Lock()
		bodies = append(bodies, req)
		mu.Unlock()
		return true
	})
	c := newClient(t, url, client.WithMaxRequestWait(100*time.Millisecond))
	ctx := t.Context()
	name := f.heldName(t)
	end.Store(time.Now().Add(wait).UnixNano())
	if _, err := c.Acquire(ctx, name, 10*time.Second, lock.WithWait(wait)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a wait on a held lock: %v", err)
	}
	if st, err := f.locks.Inspect(ctx, name); err != nil || st.Waiters != 0 {
		t.Fatalf("after the wait ended: %+v, %v; want no waiters", st, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := len(bodies); n != 2 || bodies[0].Final || *bodies[0].WaitMs != 100 || !bodies[1].Final || *bodies[1].WaitMs != 1 ||
		bodies[1].Waiter != bodies[0].Waiter {
		t.Fatalf("%d requests %+v; want one of 100 ms, not final, then one of 1 ms, final, with its waiter", n, bodies)
	}
}

// A wait its caller cuts short (its context, or Close) gives its place
// up: the call sends one request with its waiter, final and of 1 ms,
// which the server answers once the request cut short has ended there
// too. Before, the place stood DefaultWaiterTTL (3 s) ahead of everyone
// behind it, a free lock answered "held" meanwhile: an interrupted
// `fenced elect` or a cancelled Elect left an election with no leader
// for up to 3 s after its leader resigned (docs/design.md, defect 134).
func TestCutWaitLeavesTheQueue(t *testing.T) {
	f := newFixture(t)
	c := newClient(t, f.url)
	ctx := t.Context()
	for _, how := range []string{"cancelled", "deadline", "closed"} {
		t.Run(how, func(t *testing.T) {
			name := f.heldName(t)
			w := c
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var opts []lock.Option // no WithWait: the context bounds the wait
			switch how {
			case "deadline":
				cctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
			case "closed":
				w = newClient(t, f.url)
			}
			done := make(chan error, 1)
			go func() {
				_, err := w.Acquire(cctx, name, 10*time.Second, opts...)
				done <- err
			}()
			if how != "deadline" {
				f.waitWaiters(t, name, 1, 10*time.Second)
			}
			switch how {
			case "cancelled":
				cancel()
			case "closed":
				if err := w.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err == nil || errors.Is(err, lock.ErrNotAcquired) && how != "deadline" {
				t.Fatalf("a wait cut short: %v", err)
			}
			// Gone well before the waiter TTL: the request cut short ends
			// at the server as soon as it sees its connection closed.
			f.waitWaiters(t, name, 0, 2*lock.DefaultWaiterTTL/3)
		})
	}
}

// The give-up of a wait cut short runs after the call returned: a caller
// whose deadline ended the wait gets its error at the deadline, not up to
// a second later when the server does not answer the give-up (the class
// of defect 126). The proxy holds the give-up request until the test lets
// it go: the call must have returned with it still held, and the place
// goes once it reaches the server (docs/design.md, defect 134).
func TestCutWaitDoesNotWaitForItsGiveUp(t *testing.T) {
	f := newFixture(t)
	pass, _ := passOn(t, f, 0)
	let := make(chan struct{}) // closed by the test: the give-up goes on
	var arrived, ended atomic.Bool
	url := seeingAcquires(t, pass, func(req api.AcquireRequest, r *http.Request) bool {
		if !req.Final || req.WaitMs == nil || *req.WaitMs != 1 {
			return true
		}
		arrived.Store(true)
		select {
		case <-let:
			return true
		case <-r.Context().Done():
			ended.Store(true) // the client gave the give-up up
			return false
		}
	})
	c := newClient(t, url)
	ctx := t.Context()
	name := f.heldName(t)
	cut, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(cut, name, 10*time.Second)
		done <- err
	}()
	f.waitWaiters(t, name, 1, 10*time.Second)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait cut short: %v", err)
	}
	if ended.Load() {
		t.Fatal("the call returned only once its give-up had been given up: it waited for it")
	}
	close(let)
	f.waitWaiters(t, name, 0, 2*lock.DefaultWaiterTTL/3)
	if !arrived.Load() {
		t.Fatal("no give-up request came")
	}
}

// acquireCall is one way to take a lock through the client, for the tests
// of what becomes of a grant whose answer did not reach the caller.
type acquireCall = func(ctx context.Context, c *client.Client, name string) (*client.Lease, error)

func tryAcquire30s(ctx context.Context, c *client.Client, name string) (*client.Lease, error) {
	return c.TryAcquire(ctx, name, 30*time.Second)
}

// An acquisition cut short by its context while the server's grant is on
// its way back: the server granted, and the caller's context ended before
// the answer came. A fair wait's give-up found that grant through its
// waiter and released it (defect 134); a TryAcquire and an unfair Acquire
// sent none, and the grant held the lock, known to nobody, for its whole
// TTL. Each now sends one request with its waiter, a single attempt, and
// releases the grant it finds (docs/design.md, "A lost answer"). The
// server behind the test's gateway grants the first request, and its
// answer waits until the caller has gone.
func TestCutAcquireReleasesTheGrantOnItsWay(t *testing.T) {
	f := newFixture(t)
	pass, _ := passOn(t, f, 0)
	for _, tc := range []struct {
		how  string
		call acquireCall
	}{
		{"TryAcquire", tryAcquire30s},
		{"unfair Acquire", func(ctx context.Context, c *client.Client, name string) (*client.Lease, error) {
			return c.Acquire(ctx, name, 30*time.Second, lock.WithUnfair())
		}},
		{"fair Acquire", func(ctx context.Context, c *client.Client, name string) (*client.Lease, error) {
			return c.Acquire(ctx, name, 30*time.Second)
		}},
	} {
		t.Run(tc.how, func(t *testing.T) {
			name := testenv.Name(t)
			granted := make(chan struct{})
			var (
				mu     sync.Mutex
				bodies []api.AcquireRequest
			)
			url := seeingAcquires(t, pass, func(req api.AcquireRequest, r *http.Request) bool {
				mu.Lock()
				bodies = append(bodies, req)
				first := len(bodies) == 1
				mu.Unlock()
				if !first {
					return true
				}
				rec := httptest.NewRecorder()
				pass.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
				if rec.Code != http.StatusOK {
					t.Errorf("the first request: %d %s", rec.Code, rec.Body)
				}
				close(granted)
				<-r.Context().Done() // the answer is on its way when the caller goes
				return false
			})
			c := newClient(t, url)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go func() {
				<-granted
				cancel()
			}()
			if l, err := tc.call(ctx, c, name); !errors.Is(err, context.Canceled) {
				t.Fatalf("cut short once granted: %v, %v; want the context's error", l, err)
			}
			// Well within the TTL (30 s): the give-up's request and release.
			testenv.WaitUntil(t, 10*time.Second, func() bool {
				st, err := f.locks.Inspect(t.Context(), name)
				return err == nil && !st.Held
			})
			mu.Lock()
			defer mu.Unlock()
			if len(bodies) != 2 || bodies[1].Waiter != bodies[0].Waiter {
				t.Fatalf("requests %+v; want the give-up's one more, with the same waiter", bodies)
			}
		})
	}
}

// An acquisition whose last request was granted but got no answer of
// fenced's (here a proxy's 502 page after fenced granted it), once no
// request is sent again (WithRetries spent, or the wait over), gives up
// with one attempt under its waiter and releases what it finds, as one cut
// short does (TestCutAcquireReleasesTheGrantOnItsWay). Before, only a
// context that ended set the give-up off, and the grant held the lock,
// known to nobody, for its TTL (docs/design.md, defect 240).
func TestUnansweredAcquireReleasesItsGrant(t *testing.T) {
	f := newFixture(t)
	pass, _ := passOn(t, f, 0)
	for _, tc := range []struct {
		how  string
		call acquireCall
		// giveUp tells the give-up's request from the call's own: the
		// give-up starts as the call returns, and on a loaded machine it
		// may reach the proxy before the test has marked the call
		// returned. n is how many acquires came before, began when the
		// call began.
		giveUp func(req api.AcquireRequest, n int, began time.Time) bool
	}{
		{"TryAcquire", tryAcquire30s, func(_ api.AcquireRequest, n int, _ time.Time) bool {
			return n >= 1 // WithRetries(0): the call sends one
		}},
		{"Acquire with a wait", func(ctx context.Context, c *client.Client, name string) (*client.Lease, error) {
			return c.Acquire(ctx, name, 30*time.Second, lock.WithWait(300*time.Millisecond))
		}, func(req api.AcquireRequest, _ int, began time.Time) bool {
			// Final, of 1 ms, once the wait is over: the call's own are
			// all sent before.
			return req.Final && req.WaitMs != nil && *req.WaitMs <= 1 && time.Since(began) >= 300*time.Millisecond
		}},
	} {
		t.Run(tc.how, func(t *testing.T) {
			name := testenv.Name(t)
			var (
				mu       sync.Mutex
				returned bool // the call returned: what comes now is the give-up
				began    time.Time
				during   []api.AcquireRequest
				after    []api.AcquireRequest
			)
			// Every acquire of the call reaches fenced, and its answer is
			// replaced by a page, as a proxy whose upstream answer went
			// astray sends; once the call has returned, requests pass.
			front, _ := counted(t, func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				var req api.AcquireRequest
				acquire := strings.HasSuffix(r.URL.Path, "/acquire") && json.Unmarshal(body, &req) == nil
				mu.Lock()
				done := returned || acquire && tc.giveUp(req, len(during), began)
				switch {
				case acquire && done:
					after = append(after, req)
				case acquire:
					during = append(during, req)
				}
				mu.Unlock()
				if done || !acquire {
					pass.ServeHTTP(w, r)
					return
				}
				pass.ServeHTTP(httptest.NewRecorder(), r)
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusBadGateway)
				io.WriteString(w, "<html>502 Bad Gateway</html>")
			})
			c := newClient(t, front, client.WithRetries(0))
			began = time.Now()
			l, err := tc.call(t.Context(), c, name)
			mu.Lock()
			returned = true
			mu.Unlock()
			if err == nil {
				t.Fatalf("granted through the pages: %v", l)
			}
			// Well within the TTL (30 s): the give-up's request and release.
			testenv.WaitUntil(t, 10*time.Second, func() bool {
				st, err := f.locks.Inspect(t.Context(), name)
				return err == nil && !st.Held
			})
			mu.Lock()
			defer mu.Unlock()
			// One attempt (wait_ms 0), or for a fair wait, which may have
			// a place, a final request of 1 ms.
			if len(during) == 0 || len(after) != 1 || after[0].Waiter != during[0].Waiter || *after[0].WaitMs > 1 {
				t.Fatalf("requests during the call %+v, after it %+v; want the give-up's one, with the same waiter", during, after)
			}
		})
	}
}

// A wait in requests of a millisecond (WithMaxRequestWait, or a server's
// --max-wait of 1ms) sends one no sooner than 50 ms after the last began.
// Before, each answered at the end of its wait was followed by the next at
// once: a waiter of 3 s sent 1,360 requests, 2.4 s of the server's CPU
// (docs/design.md, defect 143).
func TestTinyRequestWaitsAreNoBusyLoop(t *testing.T) {
	f := newFixture(t)
	pass, _ := passOn(t, f, 0)
	url, requests := counted(t, pass.ServeHTTP)
	c := newClient(t, url, client.WithMaxRequestWait(time.Millisecond))
	ctx := t.Context()
	name := f.heldName(t)
	const wait = time.Second
	if _, err := c.Acquire(ctx, name, 10*time.Second, lock.WithWait(wait)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a wait on a held lock: %v", err)
	}
	// One a 50 ms at most, the last request too; a loaded machine sends fewer.
	if n := requests.Load(); n > int64(wait/(50*time.Millisecond))+3 {
		t.Fatalf("%d requests in a wait of %s in requests of 1 ms: a busy loop", n, wait)
	}
}

// TestServerWithAShorterMaxWait: a server whose --max-wait (400ms) is
// shorter than the client's request wait (DefaultMaxRequestWait, 30s)
// refused every waiting Acquire with 400 on wait_ms, free lock or held, so
// a default client could not use it. It now says the longest it allows
// (max_wait_ms), and the client asks for that instead: a free lock is
// taken, and a held one is waited for across requests of that length until
// the holder lets go.
func TestServerWithAShorterMaxWait(t *testing.T) {
	f := newFixture(t)
	url := f.serve(t, server.Config{MaxWait: 400 * time.Millisecond})
	c := newClient(t, url) // the default request wait
	ctx := t.Context()
	name := testenv.Name(t)

	l, err := c.Acquire(ctx, name, 5*time.Second, lock.WithWait(10*time.Second))
	if err != nil {
		t.Fatalf("a free lock, a server with --max-wait 400ms: %v", err)
	}
	// The holder lets go once the waiter has waited in its place for more
	// than twice the server's maximum: its wait spanned several requests,
	// none refused.
	other := newClient(t, url)
	done := make(chan error, 1)
	go func() {
		w, err := other.Acquire(context.Background(), name, 5*time.Second, lock.WithWait(time.Minute))
		if err == nil {
			err = w.Release(context.Background())
		}
		done <- err
	}()
	waitsLonger(t, c, name, time.Second, done)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiter, after the release: %v", err)
	}

	// An API error says the maximum.
	resp, err := http.Post(url+"/v1/locks/"+name+"/acquire", "application/json", strings.NewReader(`{"ttl_ms":5000,"wait_ms":1000}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest || eb.Error.Field != api.FieldWaitMs || eb.Error.MaxWaitMs == nil || *eb.Error.MaxWaitMs != 400 {
		t.Errorf("wait_ms 1000 to a server with --max-wait 400ms: %d %+v, want 400 on wait_ms with max_wait_ms 400", resp.StatusCode, eb.Error)
	}
}

// TestCloseEndsWaitingAcquire: Close ended an Acquire waiting for a held
// lock only when its request's wait (up to 30s) was over. Now the Acquire
// returns lock.ErrClosed at once, Close returns only after it has, and the
// client takes nothing.
func TestCloseEndsWaitingAcquire(t *testing.T) {
	f := newFixture(t)
	holder := newClient(t, f.url)
	ctx := t.Context()
	name := testenv.Name(t)
	if _, err := holder.TryAcquire(ctx, name, time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(f.url)
	if err != nil {
		t.Fatal(err)
	}
	done := waitInBackground(c, name)
	waitsLonger(t, holder, name, 0, done) // the server has the waiter in its queue
	closeEndsIt(t, c, done, "the waiting Acquire after Close", "Close returned with the Acquire still waiting")
	if _, err := c.TryAcquire(ctx, name+"-after", time.Second); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want lock.ErrClosed", err)
	}
}

// TestCloseEndsAcquireInItsBackoff: an Acquire whose server answers 503
// sleeps a backoff (up to 1s) between its requests for as long as its
// budget lasts. Close must end that sleep as it ends a request's wait: the
// Acquire returns lock.ErrClosed before Close returns, and takes nothing
// from the holder.
func TestCloseEndsAcquireInItsBackoff(t *testing.T) {
	f := newFixture(t)
	srv, err := server.New(server.Config{Locks: f.locks})
	if err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	refused := make(chan struct{}, 1) // an acquire answered 503
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			if strings.HasSuffix(r.URL.Path, "/acquire") {
				select {
				case refused <- struct{}{}:
				default:
				}
			}
			injected(w, http.StatusServiceUnavailable, "unavailable", "injected")
			return
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	holder := newClient(t, hs.URL)
	ctx := t.Context()
	name := testenv.Name(t)
	held, err := holder.TryAcquire(ctx, name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Short requests, so that the one in flight when the server starts
	// failing ends soon and the next is refused.
	c, err := client.New(hs.URL, client.WithMaxRequestWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	done := waitInBackground(c, name)
	failing.Store(true)
	select {
	case <-refused: // the Acquire sleeps its backoff now, or is about to
	case err := <-done:
		t.Fatalf("the Acquire returned before Close: %v", err)
	}
	// A second refusal: the Acquire has slept one backoff and is in the
	// next, or about to be.
	select {
	case <-refused:
	case err := <-done:
		t.Fatalf("the Acquire returned before Close: %v", err)
	}
	closeEndsIt(t, c, done, "the Acquire in its backoff after Close", "Close returned with the Acquire still retrying")
	failing.Store(false)
	st, err := holder.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Token != held.Token() {
		t.Errorf("after Close: %+v, want still held with token %d", st, held.Token())
	}
}

// waitInBackground starts an Acquire of name that waits up to an hour, and
// returns where its result goes: an error, or one saying it acquired.
func waitInBackground(c *client.Client, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		l, err := c.Acquire(context.Background(), name, 5*time.Second, lock.WithWait(time.Hour))
		if err == nil {
			err = fmt.Errorf("acquired %d", l.Token())
		}
		done <- err
	}()
	return done
}

// waitsLonger returns once name has one waiter that has waited more than
// longer (0: any time), looking through c; it fails the test if the waiting
// call, whose result goes to done, returns first.
func waitsLonger[T any](t *testing.T, c *client.Client, name string, longer time.Duration, done <-chan T) {
	t.Helper()
	for {
		st, err := c.Inspect(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Waiters == 1 && (longer == 0 || st.OldestWait > longer) {
			return
		}
		select {
		case r := <-done:
			t.Fatalf("the waiting call returned while the lock was held: %+v", r)
		case <-time.After(20 * time.Millisecond): // the next look
		}
	}
}

// closeEndsIt closes c and checks that the Acquire whose result goes to
// done returned lock.ErrClosed. Close waited for the acquisition's end,
// which runs as Acquire returns: its result is a few instructions away
// (before the fix, its request went on for 30s, its retries for an hour).
func closeEndsIt(t *testing.T, c *client.Client, done <-chan error, what, stillWaiting string) {
	t.Helper()
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, lock.ErrClosed) {
			t.Errorf("%s: %v, want lock.ErrClosed", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(stillWaiting)
	}
}
