package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// send sends a request in a goroutine of its own (no t.Fatal there) and
// delivers the answer; status -1 and the error as body if none came.
func (e *env) send(method, path, body string) <-chan response {
	ch := make(chan response, 1)
	go func() { // ends with the request: the test's context bounds it
		req, err := http.NewRequestWithContext(e.t.Context(), method, e.ts.URL+path, strings.NewReader(body))
		if err != nil {
			ch <- response{status: -1, body: []byte(err.Error())}
			return
		}
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			ch <- response{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ch <- response{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	return ch
}

// wantShuttingDown checks that r is 503 unavailable with Retry-After and
// says that fenced is shutting down.
func wantShuttingDown(t *testing.T, what string, r response) {
	t.Helper()
	if r.status == -1 {
		t.Fatalf("%s: no answer: %s", what, r.body)
	}
	msg := r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
	if !strings.Contains(msg, "shutting down") || r.header.Get("Retry-After") != retryAfter {
		t.Fatalf("%s: %q, Retry-After %q; want shutting down, Retry-After %s", what, msg, r.header.Get("Retry-After"), retryAfter)
	}
}

// TestDrain: Drain answers an acquire that waits 503 with Retry-After at
// once, and so every later wait (acquire, campaign, long poll); /readyz
// is 503; requests that do not wait are served as before.
func TestDrain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ws := &watchSignal{LeaseStore: b.store, watching: make(chan string, 1)}
			e := newEnv(t, ws, nil)
			name := testenv.Name(t)
			held := e.mustAcquire(name, `{"ttl_ms":30000}`)
			waiting := e.send("POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000,"wait_ms":30000}`)
			select {
			case <-ws.watching:
			case r := <-waiting:
				t.Fatalf("the waiting acquire answered before it waited: %d %s", r.status, r.body)
			}
			if r := e.do("GET", "/readyz", ""); r.status != http.StatusOK {
				t.Fatalf("readyz before Drain: %d %s", r.status, r.body)
			}

			e.srv.Drain()
			wantShuttingDown(t, "the waiting acquire", <-waiting)
			e.srv.Drain() // again: nothing more
			wantShuttingDown(t, "readyz", e.do("GET", "/readyz", ""))
			wantShuttingDown(t, "an acquire that would wait", e.do("POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000,"wait_ms":30000}`))

			// What does not wait is served: the holder refreshes and
			// releases, a new lock is taken and given back.
			if r := e.do("POST", "/v1/locks/"+name+"/refresh", `{"lease_id":"`+held.LeaseID+`","ttl_ms":30000}`); r.status != http.StatusOK {
				t.Fatalf("refresh while draining: %d %s", r.status, r.body)
			}
			other := e.mustAcquire(testenv.Name(t), `{"ttl_ms":5000}`)
			if r := e.release(other.Name, other.LeaseID); r.status != http.StatusOK {
				t.Fatalf("release while draining: %d %s", r.status, r.body)
			}
			if r := e.release(name, held.LeaseID); r.status != http.StatusOK {
				t.Fatalf("release while draining: %d %s", r.status, r.body)
			}
			// The waiter that Drain ended took no lease and left the queue.
			if st := e.state(name); st.Held || st.Waiters != 0 {
				t.Fatalf("after the drained wait and the release: %+v, want free with no waiter", st)
			}
			if b.name != "etcd" {
				return
			}
			// Elections need the EtcdStore itself, unwrapped.
			e = newEnv(t, b.store, nil)
			e.srv.Drain()
			election := "/v1/elections/" + testenv.Name(t)
			wantShuttingDown(t, "a long poll", e.do("GET", election+"?after_token=0&wait_ms=30000", ""))
			wantShuttingDown(t, "a campaign that would wait", e.do("POST", election+"/campaign", `{"ttl_ms":5000,"wait_ms":30000,"value":"a"}`))
			if r := e.do("GET", election, ""); r.status != http.StatusOK {
				t.Fatalf("GET of an election while draining: %d %s", r.status, r.body)
			}
		})
	}
}

// scriptsSent signals each script call go-redis sends while on is set.
type scriptsSent struct {
	on      *atomic.Bool
	sending chan struct{}
}

func (h scriptsSent) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h scriptsSent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); h.on.Load() && (n == "evalsha" || n == "eval") {
			select {
			case h.sending <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}

func (h scriptsSent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			select {
			case h.sending <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmds)
	}
}

// TestDrainWhileRedisHangs: Redis stops answering this node (a partition)
// while an acquire waits here, and its next attempt is in flight when
// Drain comes: the waiter is answered "shutting down" at once, so that its
// client asks another node. It was answered only when the attempt's
// deadline passed, seconds later: the lone script call was committed on
// the waiter's own goroutine, and go-redis ends a call at its context's
// deadline, not at its cancellation (docs/design.md, defect 197).
func TestDrainWhileRedisHangs(t *testing.T) {
	rp, err := faultproxy.New(testenv.RedisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.Close() })
	var hung atomic.Bool
	sent := scriptsSent{on: &hung, sending: make(chan struct{}, 1)}
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr(), ContextTimeoutEnabled: true}) // as fenced serve's
	rdb.AddHook(sent)
	t.Cleanup(func() { rdb.Close() })
	_, cli := testenv.Etcd(t)
	rs, err := lock.NewRedisStore(rdb, newSequencer(t, cli), lock.WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	ws := &watchSignal{LeaseStore: rs, watching: make(chan string, 1)}
	e := newEnv(t, ws, nil)
	name := testenv.Name(t)
	e.mustAcquire(name, `{"ttl_ms":30000}`)
	// With a waiter id, as the clients send: its place is kept for its
	// next request, elsewhere, and nothing is given up on the way out.
	waiting := e.send("POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000,"wait_ms":30000,"waiter":"0123456789abcdef0123456789abcdef"}`)
	select {
	case <-ws.watching:
	case r := <-waiting:
		t.Fatalf("the waiting acquire answered before it waited: %d %s", r.status, r.body)
	}
	rp.Hold(true)
	t.Cleanup(func() { rp.Hold(false) })
	hung.Store(true)
	testenv.Next(t, sent.sending) // the waiter's next attempt (a second apart at most) meets the hang

	t0 := time.Now()
	e.srv.Drain()
	select {
	case r := <-waiting:
		wantShuttingDown(t, "the waiting acquire", r)
		t.Logf("answered %s after Drain", time.Since(t0).Round(time.Millisecond))
	case <-time.After(time.Second):
		r := <-waiting
		t.Fatalf("the waiting acquire was answered %s after Drain (%d %s), with its attempt hung on Redis; README: at once",
			time.Since(t0).Round(time.Millisecond), r.status, r.body)
	}
}
