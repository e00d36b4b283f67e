package main_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestDev runs fenced dev as a process: the first line, the curl line, the
// API round trip with increasing tokens, probes and metrics, and a
// graceful SIGTERM that answers a waiting acquire at once.
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
	// Where the SDK finds etcd, and the quickstart's command line
	// (examples/quickstart's test runs it).
	if l := p.line(5 * time.Second); l != "etcd: "+etcdURL+" (tokens and leases)" {
		t.Fatalf("third line %q, want the etcd endpoint", l)
	}
	if l := p.line(5 * time.Second); l != "sdk: go run ./examples/quickstart --etcd "+etcdURL {
		t.Fatalf("fourth line %q, want the quickstart's command", l)
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
	// it is answered at once, 503 with Retry-After (try another node),
	// then fenced exits 0. The lock's queue shows that it waits.
	answered := a.queue(t, name, 10000, `{"ttl_ms":1000,"wait_ms":20000}`)
	p.signal(syscall.SIGTERM)
	wantShuttingDown(t, "a waiting acquire", answered)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(p.stderr.String(), `"msg":"shutting down`) || !strings.Contains(p.stderr.String(), `"grace":"10s"`) {
		t.Fatalf("no JSON shutdown log with the grace as text (FENCED_LOG_FORMAT=json):\n%s", p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), `"msg":"fenced dev ready","version":"`) {
		t.Fatalf("the ready line does not say the version:\n%s", p.stderr.String())
	}
	checkJSONLines(t, p.stderr.String())
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

// A fenced dev killed before it could clean up (SIGKILL) leaves its etcd
// data dir, with a 64 MB WAL, in the temporary directory; the next fenced
// dev removes it. One stopped by a signal removes its own.
func TestDevRemovesTheDataDirOfAKilledDev(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp}
	dirs := func() []string {
		t.Helper()
		d, err := filepath.Glob(filepath.Join(tmp, "fenced-etcd-*"))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	p, _ := startDev(t, env)
	left := dirs()
	if len(left) != 1 {
		t.Fatalf("fenced dev's data dirs: %v, want one", left)
	}
	p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
	if d := dirs(); len(d) != 1 || d[0] != left[0] {
		t.Fatalf("after SIGKILL: %v, want %s left behind", d, left[0])
	}

	p, _ = startDev(t, env)
	now := dirs()
	if len(now) != 1 || now[0] == left[0] {
		t.Fatalf("after a second start: %v, want only a new dir, not %s", now, left[0])
	}
	p.signal(syscall.SIGTERM)
	p.wait(30 * time.Second)
	if d := dirs(); len(d) != 0 {
		t.Fatalf("after SIGTERM: %v, want none", d)
	}
}

// checkJSONLines fails unless every line of log is a JSON object: a JSON
// log stream that a collector can parse line by line.
func checkJSONLines(t *testing.T, log string) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line that is not JSON: %q\n%s", l, log)
		}
	}
}

// TestDevRedis runs fenced dev with its leases in Redis: millisecond TTLs,
// the endpoints an SDK user needs on stdout, the latency of etcd and Redis
// calls and the build info in /metrics.
func TestDevRedis(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t) + ":"
	p, url := startDev(t, nil, "--redis-addr", testenv.RedisAddr(), "--redis-prefix", prefix)
	p.line(5 * time.Second) // try: curl
	etcdLine := p.line(5 * time.Second)
	etcdURL, ok := strings.CutSuffix(strings.TrimPrefix(etcdLine, "etcd: "), " (tokens)")
	if !ok || !strings.HasPrefix(etcdURL, "http://127.0.0.1:") {
		t.Fatalf("third line %q, want etcd: URL (tokens)", etcdLine)
	}
	if l := p.line(5 * time.Second); l != "redis: "+testenv.RedisAddr()+" (leases)" {
		t.Fatalf("fourth line %q, want the Redis address", l)
	}
	want := "sdk: go run ./examples/quickstart --etcd " + etcdURL + " --redis " + testenv.RedisAddr() + " --redis-prefix " + prefix
	if l := p.line(5 * time.Second); l != want {
		t.Fatalf("fifth line %q, want %q", l, want)
	}
	a := newAPI(t, url)
	name := testenv.Name(t)
	// A TTL etcd leases would round up, and long enough for the release
	// below to come before it ends on a loaded machine (250 ms did not:
	// the first grant of a fresh server takes the token floor too).
	l := a.acquire(name, 1500)
	if l.ttlMs != 1500 {
		t.Fatalf("ttl_ms %d: Redis leases keep the TTL asked", l.ttlMs)
	}
	if n, err := rdb.Exists(t.Context(), prefix+"{"+name+"}:lease").Result(); err != nil || n != 1 {
		t.Fatalf("lease key in Redis: %d, %v", n, err)
	}
	a.release(name, l.id)
	_, body := a.text("/metrics")
	for _, m := range []string{
		`fenced_build_info{goversion="go`,
		`fenced_redis_command_duration_seconds_count{command="evalsha"}`,
		`fenced_etcd_request_duration_seconds_count{method="KV/Txn"}`,
		`fenced_http_request_duration_seconds_count{route="/v1/locks/{name}/acquire"} 1`,
		"fenced_waiters 0",
	} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

// TestDevRedisDownLogsJSON: with Redis unreachable, go-redis's own log
// lines go through slog and keep the log JSON; /readyz says Redis.
func TestDevRedisDownLogsJSON(t *testing.T) {
	t.Parallel()
	dead := strings.TrimPrefix(testenv.FreeURL(t), "http://")
	p, url := startDev(t, []string{"FENCED_LOG_FORMAT=json"}, "--redis-addr", dead)
	a := newAPI(t, url)
	if code, body := a.text("/readyz"); code != 503 || !strings.Contains(body, "redis") {
		t.Fatalf("readyz with Redis down: %d %s", code, body)
	}
	eventually(t, 20*time.Second, "a go-redis line in the log", func() bool {
		return strings.Contains(p.stderr.String(), `"component":"go-redis"`)
	})
	p.signal(syscall.SIGTERM)
	p.wait(20 * time.Second)
	checkJSONLines(t, p.stderr.String())
}

// TestReadyzSaysWhyRedisIsDown: with nothing listening at --redis-addr,
// /readyz says that the connection is refused there and what to check. It
// said "context deadline exceeded": go-redis retries a refused dial, with
// backoff, longer than --ready-timeout, and the check ran out of time with
// the cause only in go-redis's log line.
func TestReadyzSaysWhyRedisIsDown(t *testing.T) {
	t.Parallel()
	dead := strings.TrimPrefix(testenv.FreeURL(t), "http://") // a closed local port
	_, url := startDev(t, nil, "--redis-addr", dead)
	code, body := newAPI(t, url).text("/readyz")
	for _, want := range []string{"dial tcp " + dead + ": connect: connection refused", "--redis-addr"} {
		if code != 503 || !strings.Contains(body, want) {
			t.Errorf("readyz with nothing at --redis-addr %s: %d %s; want 503 and %q", dead, code, body, want)
		}
	}
}
