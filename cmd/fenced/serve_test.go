package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestServeRedis runs fenced serve with leases in the machine's Redis and
// tokens from an external etcd, then the admin floor commands against the
// same etcd.
func TestServeRedis(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	e, _ := testenv.Etcd(t)
	name := testenv.Name(t)
	redisPrefix, etcdPrefix := name+":", "/"+name+"/"
	p := start(t, []string{"FENCED_REDIS_ADDR=" + testenv.RedisAddr(), "FENCED_ETCD_ENDPOINTS=" + e.ClientURL()},
		"serve", "--listen", "127.0.0.1:0", "--redis-prefix", redisPrefix, "--etcd-prefix", etcdPrefix)
	a := newAPI(t, p.listening())

	a.must(200, "GET", "/readyz", "")
	// 1.5 s: long enough for the 409 below to come while it is held on a
	// loaded machine (a dev test's 250 ms lease ran out there, in CI).
	first := a.acquire(name, 1500)
	if first.ttlMs != 1500 {
		t.Fatalf("ttl_ms %d: Redis leases keep the TTL asked", first.ttlMs)
	}
	// The lease is in Redis.
	if n, err := rdb.Exists(context.Background(), redisPrefix+"{"+name+"}:lease").Result(); err != nil || n != 1 {
		t.Fatalf("lease key in Redis: %d, %v", n, err)
	}
	a.must(409, "POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":500}`)
	// Not released: a waiter gets it when the first lease expires.
	m := a.must(200, "POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":1500,"wait_ms":5000}`)
	second := toLease(t, m)
	if second.token <= first.token {
		t.Fatalf("token %d after %d", second.token, first.token)
	}
	a.release(name, second.id)

	// The restore step: raise the floor far above, and tokens follow.
	code, out, stderr := run(t, nil, "admin", "floor", "--etcd-endpoints", e.ClientURL(), "--etcd-prefix", etcdPrefix)
	if code != 0 || !strings.HasPrefix(out, "next token >= ") {
		t.Fatalf("admin floor: exit %d, %q %s", code, out, stderr)
	}
	const min = 5_000_000_000_000_000
	code, out, stderr = run(t, []string{"FENCED_ETCD_ENDPOINTS=" + e.ClientURL()}, "admin", "raise-floor", "--etcd-prefix", etcdPrefix, "--min-token", fmt.Sprint(min))
	var next uint64
	if _, err := fmt.Sscanf(out, "floor raised: next token >= %d", &next); code != 0 || err != nil || next <= min {
		t.Fatalf("admin raise-floor: exit %d, %q (%v) %s", code, out, err, stderr)
	}
	if l := a.acquire(name, 500); l.token < next {
		t.Fatalf("token %d after raising the floor to %d", l.token, next)
	}

	p.signal(syscall.SIGINT)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGINT, want 0", code)
	}
}

// node is one fenced serve process with an embedded etcd member.
type node struct {
	name, clientURL string
	p               *proc
	a               *api
}

// TestServeClusterLeaderKilled runs three fenced serve nodes whose
// embedded etcd members form one Raft cluster, with leases in etcd. It
// kills the etcd leader's process with SIGKILL; the other two go on
// issuing strictly larger tokens.
func TestServeClusterLeaderKilled(t *testing.T) {
	t.Parallel()
	nodes := make([]*node, 3)
	var initial []string
	peers := make([]string, 3)
	for i := range nodes {
		nodes[i] = &node{name: fmt.Sprint("n", i), clientURL: testenv.FreeURL(t)}
		peers[i] = testenv.FreeURL(t)
		initial = append(initial, nodes[i].name+"="+peers[i])
	}
	for i, n := range nodes { // all start at once: each waits for a quorum
		n.p = start(t, []string{"FENCED_LEASE_STORE=etcd"}, "serve", "--listen", "127.0.0.1:0",
			"--etcd-data-dir", t.TempDir(), "--etcd-name", n.name,
			"--etcd-peer-url", peers[i], "--etcd-client-url", n.clientURL,
			"--etcd-initial-cluster", strings.Join(initial, ","),
			"--etcd-heartbeat-interval", "50ms", "--etcd-election-timeout", "500ms", "--etcd-unsafe-no-fsync")
	}
	var wg sync.WaitGroup
	urls := make([]string, 3)
	for i, n := range nodes { // read each node's first line; Fatal only on this goroutine
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case l := <-n.p.lines:
				urls[i] = strings.TrimPrefix(l, "fenced listening on ")
			case <-time.After(60 * time.Second):
			}
		}()
	}
	wg.Wait()
	for i, n := range nodes {
		if !strings.HasPrefix(urls[i], "http://127.0.0.1:") {
			t.Fatalf("node %s did not start: first line %q; stderr:\n%s", n.name, urls[i], n.p.stderr.String())
		}
		n.a = newAPI(t, urls[i])
	}

	lockName := testenv.Name(t)
	var last uint64
	// grant acquires and releases the lock through n, retrying while the
	// cluster elects a leader; tokens must go up strictly.
	grant := func(n *node) {
		t.Helper()
		var l lease
		eventually(t, 30*time.Second, "acquire through "+n.name, func() bool {
			code, m, err := n.a.do("POST", "/v1/locks/"+lockName+"/acquire", `{"ttl_ms":1000,"wait_ms":3000}`)
			if err != nil || code != 200 {
				return false
			}
			l = toLease(t, m)
			return true
		})
		if l.token <= last {
			t.Fatalf("token %d through %s after %d", l.token, n.name, last)
		}
		last = l.token
		// A failed release only leaves the lease to expire (1s).
		_, _, _ = n.a.do("POST", "/v1/locks/"+lockName+"/release", `{"lease_id":"`+l.id+`"}`)
	}
	for i := 0; i < 6; i++ {
		grant(nodes[i%3])
	}

	leader := findLeader(t, nodes)
	leader.p.signal(syscall.SIGKILL)
	leader.p.wait(10 * time.Second)
	before := last
	var rest []*node
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	for i := 0; i < 6; i++ {
		grant(rest[i%2])
	}
	t.Logf("killed leader %s; tokens went from %d to %d", leader.name, before, last)
}

// findLeader asks each member for its status and returns the node whose
// member is the Raft leader.
func findLeader(t *testing.T, nodes []*node) *node {
	t.Helper()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.clientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var leader *node
	eventually(t, 20*time.Second, "a leader", func() bool {
		for _, n := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := cli.Status(ctx, n.clientURL)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				leader = n
				return true
			}
		}
		return false
	})
	return leader
}

// TestServeMemberCompactionRetention: --etcd-compaction-retention reaches
// the embedded member: with a second of history, a read at the first
// revision comes to be refused as compacted within seconds (with the
// default minute, not for a minute).
func TestServeMemberCompactionRetention(t *testing.T) {
	t.Parallel()
	clientURL := testenv.FreeURL(t)
	p := start(t, []string{"FENCED_LEASE_STORE=etcd"}, "serve", "--listen", "127.0.0.1:0",
		"--etcd-data-dir", t.TempDir(), "--etcd-client-url", clientURL,
		"--etcd-compaction-retention", "1s", "--etcd-unsafe-no-fsync")
	newAPI(t, p.listening()).must(200, "GET", "/readyz", "")
	testenv.WaitCompacted(t, testenv.EtcdClient(t, clientURL), "k", 30*time.Second)
}

// TestServeWarnsOfAnEvictingRedis: fenced serve on a Redis with a
// maxmemory and an evicting policy (as many managed services default to)
// logs a warning that names the policy and the fix, once, at start; on
// Redis's default (noeviction) it says nothing of it.
func TestServeWarnsOfAnEvictingRedis(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"}, true},
		{nil, false},
	} {
		r := testenv.StartRedis(t, c.args...)
		p := start(t, []string{"FENCED_REDIS_ADDR=" + r.Addr, "FENCED_ETCD_ENDPOINTS=" + e.ClientURL()},
			"serve", "--listen", "127.0.0.1:0", "--etcd-prefix", "/"+testenv.Name(t)+"/")
		newAPI(t, p.listening()).must(200, "GET", "/readyz", "")
		// The warning comes before the ready line, if at all.
		eventually(t, 10*time.Second, "the ready log line", func() bool { return strings.Contains(p.stderr.String(), "fenced serve ready") })
		log := p.stderr.String()
		warned := strings.Contains(log, "Redis may evict held leases") &&
			strings.Contains(log, "maxmemory_policy=volatile-lru") && strings.Contains(log, "CONFIG SET maxmemory-policy noeviction")
		if warned != c.warn || (!c.warn && strings.Contains(log, "evict")) {
			t.Fatalf("Redis started with %q: warned %v, want %v; log:\n%s", c.args, warned, c.warn, log)
		}
	}
}

// TestEmbeddedEtcdLogsInTheLogFormat: the embedded etcd's own lines follow
// --log-format as fenced's do, marked component=etcd. They were zap JSON
// ({"level":"error","ts":...,"caller":...,"stacktrace":...}) whatever the
// flag said, in the middle of a text log.
func TestEmbeddedEtcdLogsInTheLogFormat(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"text", "json"} {
		peer, other, client := testenv.FreeURL(t), testenv.FreeURL(t), testenv.FreeURL(t)
		// Joining a cluster none of whose members runs: etcd logs
		// "bootstrap failed" as an error, and the start fails.
		code, _, stderr := run(t, nil, "serve", "--lease-store", "etcd", "--log-format", format,
			"--etcd-data-dir", t.TempDir(), "--etcd-name", "a", "--etcd-peer-url", peer, "--etcd-client-url", client,
			"--etcd-initial-cluster", "a="+peer+",b="+other, "--etcd-initial-cluster-state", "existing")
		var line string
		for _, l := range strings.Split(stderr, "\n") {
			if strings.Contains(l, "bootstrap failed") && !strings.HasPrefix(l, "fenced: ") {
				line = l
			}
		}
		if code != 1 || line == "" {
			t.Fatalf("--log-format %s: exit %d, want 1 and etcd's line \"bootstrap failed\"; stderr:\n%s", format, code, stderr)
		}
		if format == "text" {
			if !strings.HasPrefix(line, "time=") || !strings.Contains(line, `level=ERROR msg="bootstrap failed" component=etcd`) {
				t.Errorf("--log-format text: etcd's line %q, want slog text with component=etcd", line)
			}
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["level"] != "ERROR" || m["msg"] != "bootstrap failed" || m["component"] != "etcd" {
			t.Errorf("--log-format json: etcd's line %q (%v), want slog JSON with \"component\":\"etcd\"", line, err)
		}
	}
}

// TestServeRedisRefusalSaysWhatToDo: fenced serve with a Redis setting
// that Redis refuses (a database it does not have, no password where it
// wants one) starts, is not ready, and its log at start and /readyz name
// the setting to fix; neither says that Redis does not answer, since it
// did (docs/design.md, defect 195).
func TestServeRedisRefusalSaysWhatToDo(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	r := testenv.StartRedis(t)
	if err := r.Client().ConfigSet(t.Context(), "requirepass", "s3cret-s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"db", []string{"--redis-addr", testenv.RedisAddr(), "--redis-db", "99"}, []string{"ERR DB index", "--redis-db", "databases"}},
		{"password", []string{"--redis-addr", r.Addr}, []string{"NOAUTH", "--redis-password"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := start(t, []string{"FENCED_ETCD_ENDPOINTS=" + e.ClientURL()},
				append([]string{"serve", "--listen", "127.0.0.1:0", "--etcd-prefix", "/" + testenv.Name(t) + "/"}, c.args...)...)
			a := newAPI(t, p.listening())
			// The check at start comes before the listener.
			started := p.stderr.String()
			code, body := a.text("/readyz")
			if code != 503 {
				t.Fatalf("/readyz %d %s, want 503", code, body)
			}
			for _, w := range append(c.want, "refuses fenced") {
				if !strings.Contains(started, w) {
					t.Errorf("the log at start does not say %q:\n%s", w, started)
				}
				if !strings.Contains(body, w) {
					t.Errorf("/readyz %s: does not say %q", body, w)
				}
			}
			if log := p.stderr.String(); strings.Contains(log, "does not answer") || strings.Contains(log, "is reachable") {
				t.Errorf("Redis answered, with a refusal; the log says it does not, or to check that it is reachable:\n%s", log)
			}
		})
	}
}

// TestServeEtcdDownAtStartSaysWhere: fenced serve whose etcd refuses
// connections waits for it before serving; its log, all the operator has
// then, names the endpoints, why (connection refused) and what to check,
// not only "context deadline exceeded" (docs/design.md, defect 196).
func TestServeEtcdDownAtStartSaysWhere(t *testing.T) {
	t.Parallel()
	closed := testenv.FreeURL(t) // nothing listens there
	p := start(t, []string{"FENCED_REDIS_ADDR=" + testenv.RedisAddr(), "FENCED_ETCD_ENDPOINTS=" + closed}, "serve", "--listen", "127.0.0.1:0")
	eventually(t, 15*time.Second, "a warning", func() bool { return strings.Contains(p.stderr.String(), "etcd does not answer") })
	log := p.stderr.String()
	for _, w := range []string{"etcd_endpoints=" + closed, strings.TrimPrefix(closed, "http://") + ": connect: connection refused", "--etcd-endpoints", "etcdctl --endpoints"} {
		if !strings.Contains(log, w) {
			t.Errorf("the log does not say %q:\n%s", w, log)
		}
	}
}
