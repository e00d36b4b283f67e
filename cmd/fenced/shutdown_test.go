package main_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// answer is what a request got: its status, Retry-After and error code,
// or err if no answer came.
type answer struct {
	status     int
	retryAfter string
	code       string
	body       string
	err        error
}

// send sends a request in a goroutine of its own and delivers its answer
// on the channel returned.
func (a *api) send(method, path, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() { // ends with the request, bounded by hc's timeout
		ch <- a.answer(method, path, body)
	}()
	return ch
}

// queue holds lock name for ttlMs and sends an acquire of it that waits
// (body), returning once the lock's queue shows it waiting; its answer
// comes on the channel.
func (a *api) queue(t *testing.T, name string, ttlMs int, body string) <-chan answer {
	t.Helper()
	a.acquire(name, ttlMs)
	ch := a.send("POST", "/v1/locks/"+name+"/acquire", body)
	eventually(t, 10*time.Second, "the acquire waits in the lock's queue", func() bool {
		w, _ := a.must(200, "GET", "/v1/locks/"+name, "")["waiters"].(float64)
		return w == 1
	})
	return ch
}

func (a *api) answer(method, path, body string) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := a.request(ctx, method, path, body)
	if err != nil {
		return answer{err: err}
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{err: err}
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), code: e.Error.Code, body: string(b)}
}

// wantShuttingDown fails the test unless what got a 503 unavailable with
// Retry-After that says fenced is shutting down.
func wantShuttingDown(t *testing.T, what string, ch <-chan answer) {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil || r.status != http.StatusServiceUnavailable || r.code != "unavailable" || r.retryAfter == "" || !strings.Contains(r.body, "shutting down") {
			t.Errorf("%s during shutdown: HTTP %d Retry-After %q %s (err %v); want 503 unavailable, shutting down, with Retry-After", what, r.status, r.retryAfter, r.body, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s not answered during shutdown", what)
	}
}

// TestDevShutdownEndsWaits: on SIGTERM, a waiting acquire and an election
// long poll are answered at once with 503 unavailable and Retry-After
// (retry on another node), not cut off after --shutdown-grace, which is
// shorter than their waits here.
func TestDevShutdownEndsWaits(t *testing.T) {
	t.Parallel()
	etcdURL := testenv.FreeURL(t)
	p, url := startDev(t, []string{"FENCED_ETCD_CLIENT_URL=" + etcdURL}, "--shutdown-grace", "1s")
	a := newAPI(t, url)
	etcd := newAPI(t, etcdURL)
	// fenced watches etcd itself: count the watches the requests add.
	watchers := func() int {
		t.Helper()
		code, body := etcd.text("/metrics")
		_, v, _ := strings.Cut(body, "\netcd_debugging_mvcc_watcher_total ")
		v, _, _ = strings.Cut(v, "\n")
		n, err := strconv.Atoi(v)
		if code != 200 || err != nil {
			t.Fatalf("etcd's watcher count: HTTP %d, %q: %v", code, v, err)
		}
		return n
	}
	before := watchers()

	// A long poll until someone leads an election nobody leads: it
	// watches the election's key in etcd.
	election := testenv.Name(t)
	poll := a.send("GET", "/v1/elections/"+election+"?after_token=0&wait_ms=20000", "")
	eventually(t, 10*time.Second, "the long poll watches the election in etcd", func() bool { return watchers() == before+1 })

	// An acquire waiting for a held lock: it queues.
	name := testenv.Name(t)
	acquire := a.queue(t, name, 30000, `{"ttl_ms":5000,"wait_ms":20000}`)

	p.signal(syscall.SIGTERM)
	wantShuttingDown(t, "a waiting acquire", acquire)
	wantShuttingDown(t, "an election long poll", poll)
	if code := p.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0", code)
	}
	if s := p.stderr.String(); strings.Contains(s, "cut off") {
		t.Errorf("requests cut off after the grace:\n%s", s)
	}
}
