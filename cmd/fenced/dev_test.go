package main_test

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestDev runs fenced dev as a process: the first line, the curl line, the
// API round trip with increasing tokens, probes and metrics, and a
// graceful SIGTERM that lets an in-flight acquire finish.
func TestDev(t *testing.T) {
	t.Parallel()
	// The environment says a port that cannot be bound; the flag wins.
	etcdURL := testenv.FreeURL(t)
	p, url := startDev(t, []string{"FENCED_LISTEN=127.0.0.1:1", "FENCED_LOG_FORMAT=json", "FENCED_ETCD_CLIENT_URL=" + etcdURL})
	l := p.line(5 * time.Second)
	if !strings.HasPrefix(l, "try: curl -X POST") || !strings.Contains(l, url+"/v1/locks/demo/acquire") || !strings.Contains(l, `{"ttl_ms":10000}`) {
		t.Fatalf("second line %q, want a curl command", l)
	}
	// The line a newcomer copies must work as printed.
	out, err := exec.Command("sh", "-c", strings.TrimPrefix(l, "try: ")+" -s").Output()
	if err != nil || !strings.Contains(string(out), `"name":"demo"`) || !strings.Contains(string(out), `"token":`) {
		t.Fatalf("the printed curl line: %s, %v; want a granted lease", out, err)
	}
	a := newAPI(t, url)
	name := testenv.Name(t)

	first := a.acquire(name, 5000)
	if first.ttlMs != 5000 {
		t.Fatalf("ttl_ms %d, want 5000", first.ttlMs)
	}
	m := a.must(409, "POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000}`)
	if e, _ := m["error"].(map[string]any); e["code"] != "held" {
		t.Fatalf("second acquire: %v, want code held", m)
	}
	m = a.must(200, "GET", "/v1/locks/"+name, "")
	if m["held"] != true || uint64(m["token"].(float64)) != first.token || m["name"] != name {
		t.Fatalf("inspect: %v", m)
	}
	m = a.must(200, "POST", "/v1/locks/"+name+"/refresh", fmt.Sprintf(`{"lease_id":%q,"ttl_ms":5000}`, first.id))
	if r := toLease(t, m); r.token != first.token || r.id != first.id {
		t.Fatalf("refresh: %v", m)
	}
	a.release(name, first.id)
	a.must(200, "POST", "/v1/locks/"+name+"/release", fmt.Sprintf(`{"lease_id":%q}`, first.id)) // a retried release succeeds
	a.must(410, "POST", "/v1/locks/"+name+"/refresh", fmt.Sprintf(`{"lease_id":%q}`, first.id))
	if a.held(name) {
		t.Fatal("held after release")
	}
	prev := first.token
	for i := 0; i < 3; i++ {
		l := a.acquire(name, 5000)
		if l.token <= prev {
			t.Fatalf("token %d after %d", l.token, prev)
		}
		prev = l.token
		a.release(name, l.id)
	}
	a.must(200, "GET", "/healthz", "")
	a.must(200, "GET", "/readyz", "")
	a.must(400, "POST", "/v1/locks/bad%2Fname/acquire", "")
	// Four grants above and the curl line's.
	if code, body := a.text("/metrics"); code != 200 || !strings.Contains(body, "fenced_tokens_issued_total 5") {
		t.Fatalf("metrics: HTTP %d\n%s", code, body)
	}

	// An acquire waiting on a held lock is in flight when SIGTERM comes:
	// it gets its answer (409 after wait_ms), then fenced exits 0. The
	// waiter's etcd watch shows that the request is in the server.
	a.acquire(name, 10000)
	answered := make(chan int, 1)
	go func() {
		code, _, _ := a.do("POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":1000,"wait_ms":2000}`)
		answered <- code
	}()
	etcd := newAPI(t, etcdURL)
	eventually(t, 10*time.Second, "the waiting acquire watches the lock in etcd", func() bool {
		code, body := etcd.text("/metrics")
		return code == 200 && strings.Contains(body, "\netcd_debugging_mvcc_watcher_total 1\n")
	})
	p.signal(syscall.SIGTERM)
	select {
	case code := <-answered:
		if code != 409 {
			t.Fatalf("in-flight acquire answered %d during shutdown, want 409", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("in-flight acquire not answered")
	}
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(p.stderr.String(), `"msg":"shutting down`) {
		t.Fatalf("no JSON shutdown log (FENCED_LOG_FORMAT=json):\n%s", p.stderr.String())
	}
}

// TestDevRestartKeepsTokensIncreasing kills fenced dev with SIGKILL and
// starts it again on the same --data-dir: tokens go on increasing.
func TestDevRestartKeepsTokensIncreasing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, url := startDev(t, nil, "--data-dir", dir)
	a := newAPI(t, url)
	var last uint64
	for i := 0; i < 3; i++ {
		l := a.acquire(fmt.Sprint("r-", i), 5000)
		if l.token <= last {
			t.Fatalf("token %d after %d", l.token, last)
		}
		last = l.token
	}
	p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)

	_, url = startDev(t, nil, "--data-dir", dir)
	a = newAPI(t, url)
	for i := 0; i < 3; i++ {
		l := a.acquire(fmt.Sprint("after-", i), 5000)
		if l.token <= last {
			t.Fatalf("token %d after the restart, want > %d", l.token, last)
		}
		last = l.token
	}
}
