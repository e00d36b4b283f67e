package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdWithoutLeader: while the etcd member fenced talks to has no
// leader, a release neither hangs until the backend timeout nor goes
// unlogged: it is a 503 with Retry-After at once, and the log names the
// backend and the time it took.
func TestEtcdWithoutLeader(t *testing.T) {
	t.Parallel()
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.EtcdClient(t, members[0].ClientURL())
	store, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var logs testenv.SyncBuffer
	e := newEnv(t, store, func(c *Config) {
		c.BackendTimeout = time.Hour // a hang would show as a hung test, not a 503
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	name := testenv.Name(t)
	l := e.mustAcquire(name, `{"ttl_ms":30000}`)
	members[1].Close()
	members[2].Close()
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := cli.Status(t.Context(), members[0].ClientURL())
		return err == nil && st.Leader == 0
	})
	r := e.release(name, l.LeaseID)
	msg := r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
	if !strings.Contains(msg, "no leader") {
		t.Fatalf("release without an etcd leader: %q, want etcd's no-leader error", msg)
	}
	if ra := r.header.Get("Retry-After"); ra == "" {
		t.Fatal("503 without Retry-After")
	}
	if out := logs.String(); !strings.Contains(out, `msg="lease store failed" op=release`) || !strings.Contains(out, "backend=etcd") || !strings.Contains(out, "took=") {
		t.Fatalf("log lacks the failure with its backend and duration:\n%s", out)
	}
	// And what to do about it: not "check that it is reachable", which it is.
	if out := logs.String(); !strings.Contains(out, "etcd has no leader where fenced asked") || !strings.Contains(out, "etcdctl endpoint status") {
		t.Fatalf("log lacks the no-leader hint:\n%s", out)
	}
}

// TestEtcdHangsBackendTimeout: while etcd stops answering (a partition or
// a frozen member, not a refusal), every request ends at the backend
// timeout with a 503, also the one whose operation is the one sending its
// batch to etcd (docs/design.md, defect 9).
func TestEtcdHangsBackendTimeout(t *testing.T) {
	e, _ := testenv.Etcd(t)
	p, cli := testenv.EtcdThroughProxy(t, e)
	store, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var logs testenv.SyncBuffer
	env := newEnv(t, store, func(c *Config) {
		c.BackendTimeout = 300 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	name := testenv.Name(t)
	l := env.mustAcquire(name, `{"ttl_ms":30000}`)
	p.Hold(true)
	defer p.Hold(false)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/locks/" + name + "/release", `{"lease_id":"` + l.LeaseID + `"}`},
		{"POST", "/v1/locks/" + testenv.Name(t) + "/acquire", `{"ttl_ms":30000}`},
		{"POST", "/v1/locks/" + name + "/refresh", `{"lease_id":"` + l.LeaseID + `"}`},
	} {
		t0 := time.Now()
		r := env.do(c.method, c.path, c.body)
		took := time.Since(t0)
		r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
		if took > 3*time.Second {
			t.Errorf("%s %s answered after %s; the backend timeout is 300ms", c.method, c.path, took.Round(time.Millisecond))
		}
	}
	// The log tells the operator which backend did not answer, for every
	// operation.
	for _, op := range []string{"release", "acquire", "refresh"} {
		if !strings.Contains(logs.String(), `msg="lease store failed" op=`+op+` lock=`) ||
			!regexp.MustCompile(`op=`+op+` lock=\S+ backend=etcd `).MatchString(logs.String()) {
			t.Errorf("the log does not name etcd for the %s that timed out:\n%s", op, logs.String())
		}
	}
	// And says what bounds the wait.
	if !strings.Contains(logs.String(), "--backend-timeout bounds each request") {
		t.Errorf("the log of a request that timed out does not name --backend-timeout:\n%s", logs.String())
	}
}

// failedOnce wraps a store and says when an Acquire first failed other
// than with ErrNotAcquired.
type failedOnce struct {
	lock.LeaseStore
	failed chan error
	once   sync.Once
}

func (f *failedOnce) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	g, err := f.LeaseStore.Acquire(ctx, req)
	if err != nil && !errors.Is(err, lock.ErrNotAcquired) {
		f.once.Do(func() { f.failed <- err })
	}
	return g, err
}

// TestAcquireWaitRidesOutARedisRestart: an acquire with wait_ms that meets
// a Redis that is down keeps trying, and answers 200 once Redis is back
// (docs/design.md, "Riding out an outage"); before, it answered 503 at the
// first failed attempt.
func TestAcquireWaitRidesOutARedisRestart(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	s := &failedOnce{LeaseStore: redisStoreOn(t, r.Addr), failed: make(chan error, 1)}
	e := newEnv(t, s, nil)
	r.Kill()
	type answer struct {
		status int
		body   string
		err    error
	}
	res := make(chan answer, 1)
	go func() {
		resp, err := e.ts.Client().Post(e.ts.URL+"/v1/locks/"+testenv.Name(t)+"/acquire", "application/json",
			strings.NewReader(`{"ttl_ms":5000,"wait_ms":30000}`))
		if err != nil {
			res <- answer{err: err}
			return
		}
		res <- answer{status: resp.StatusCode, body: string(readAll(resp))}
	}()
	if err := testenv.Next(t, s.failed); !strings.Contains(err.Error(), "redis") {
		t.Fatalf("the attempt while Redis was down: %v", err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	a := testenv.Next(t, res)
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"token"`) {
		t.Fatalf("acquire with wait_ms across a Redis restart: %d %s %v, want 200 with a token", a.status, a.body, a.err)
	}
}

// TestEtcdOutOfSpace: when etcd's database reached its space quota, etcd
// raises its NOSPACE alarm and refuses every write. The 503 and the log say
// that, and what an operator does about it, rather than "check that etcd is
// reachable", which it is. The alarm is raised through etcd's maintenance
// API, as etcd raises it itself.
func TestEtcdOutOfSpace(t *testing.T) {
	e, cli := testenv.Etcd(t)
	store, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var logs testenv.SyncBuffer
	env := newEnv(t, store, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	st, err := cli.Status(t.Context(), e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	alarm := &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}
	if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(t.Context(), alarm); err != nil {
		t.Fatal(err)
	}
	r := env.do("POST", "/v1/locks/"+testenv.Name(t)+"/acquire", `{"ttl_ms":30000}`)
	msg := r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
	wantSaid(t, "acquire with etcd out of space", msg, &logs, "space quota", "etcdctl alarm disarm", "--auto-compaction-retention")
	// etcd still answers reads, and /readyz said ready: every acquisition
	// failed while the probes passed.
	msg = env.do("GET", "/readyz", "").errCode(t, http.StatusServiceUnavailable, codeUnavailable)
	wantSaid(t, "readyz with etcd out of space", msg, &logs, "NOSPACE", "etcdctl alarm disarm", "refuses writes")
	if _, err := cli.AlarmDisarm(t.Context(), &clientv3.AlarmMember{MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	env.mustAcquire(testenv.Name(t), `{"ttl_ms":30000}`) // writes again once disarmed
	if r := env.do("GET", "/readyz", ""); r.status != http.StatusOK {
		t.Fatalf("readyz once disarmed: %d %s", r.status, r.body)
	}
}

// wantSaid checks that an answer's message, and the log, say each of want.
func wantSaid(t *testing.T, what, msg string, logs *testenv.SyncBuffer, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: %q, want it to say %q", what, msg, w)
		}
		if !strings.Contains(logs.String(), w) {
			t.Errorf("%s: the log does not say %q:\n%s", what, w, logs.String())
		}
	}
}

// TestRedisRefusesWrites: a Redis that answers PING but refuses writes
// (at its maxmemory with noeviction; a read-only replica, as after a
// failover) fails every acquisition. /readyz says so, where it said ready
// when it sent PING, and the 503s and the log say what to do.
func TestRedisRefusesWrites(t *testing.T) {
	r := testenv.StartRedis(t)
	var logs testenv.SyncBuffer
	env := newEnv(t, redisStoreOn(t, r.Addr), func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	rdb := r.Client()
	for _, c := range []struct {
		refusal      string
		refuse, undo []any
		want         []string
	}{
		{"OOM", []any{"CONFIG", "SET", "maxmemory", "1"}, []any{"CONFIG", "SET", "maxmemory", "0"}, []string{"OOM", "raise maxmemory", "noeviction"}},
		{"READONLY", []any{"REPLICAOF", "127.0.0.1", strconv.Itoa(testenv.StartRedis(t).Port())}, []any{"REPLICAOF", "NO", "ONE"}, []string{"READONLY", "replica", "--redis-sentinel-addrs"}},
	} {
		t.Run(c.refusal, func(t *testing.T) {
			if r := env.do("GET", "/readyz", ""); r.status != http.StatusOK {
				t.Fatalf("readyz before: %d %s", r.status, r.body)
			}
			if err := rdb.Do(t.Context(), c.refuse...).Err(); err != nil {
				t.Fatal(err)
			}
			msg := env.do("GET", "/readyz", "").errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			wantSaid(t, "readyz", msg, &logs, append(c.want, "refuses writes")...)
			msg = env.do("POST", "/v1/locks/"+testenv.Name(t)+"/acquire", `{"ttl_ms":30000}`).errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			wantSaid(t, "acquire", msg, &logs, c.want...)
			if err := rdb.Do(t.Context(), c.undo...).Err(); err != nil {
				t.Fatal(err)
			}
			env.mustAcquire(testenv.Name(t), `{"ttl_ms":30000}`)
			if r := env.do("GET", "/readyz", ""); r.status != http.StatusOK {
				t.Fatalf("readyz after: %d %s", r.status, r.body)
			}
		})
	}
}

// TestRedisRefusesFenced: a Redis that answers and refuses fenced's
// connection (a password it wants and fenced lacks, a wrong one, an ACL
// user without the commands, a database it does not have): /readyz, the
// 503s and the log name the setting to fix, and do not say that Redis
// does not answer (docs/design.md, defect 195).
func TestRedisRefusesFenced(t *testing.T) {
	r := testenv.StartRedis(t)
	const pass = "s3cret-s3cret"
	for _, cmd := range [][]any{
		{"ACL", "SETUSER", "pinger", "on", ">" + pass, "+ping", "~*"},
		// Its scripts, but not what they call: Redis 7.0 refuses that
		// with an ERR, not NOPERM (defect 211).
		{"ACL", "SETUSER", "scripter", "on", ">" + pass, "+ping", "+evalsha", "+eval", "~*", "&*"},
		{"CONFIG", "SET", "requirepass", pass},
	} {
		if err := r.Client().Do(t.Context(), cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		refusal string
		opts    func(*redis.Options)
		want    []string
	}{
		{"NOAUTH", func(o *redis.Options) {}, []string{"NOAUTH", "--redis-password"}},
		{"WRONGPASS", func(o *redis.Options) { o.Password = "wrong" }, []string{"WRONGPASS", "--redis-password", "--redis-username"}},
		{"NOPERM", func(o *redis.Options) { o.Username, o.Password = "pinger", pass }, []string{"NOPERM", "--redis-username", "ACL SETUSER", "Redis ACL"}},
		{"ScriptACL", func(o *redis.Options) { o.Username, o.Password = "scripter", pass }, []string{"can't run this command", "--redis-username", "ACL SETUSER"}},
		{"DB", func(o *redis.Options) { o.Password, o.DB = pass, 99 }, []string{"DB index", "--redis-db", "databases"}},
	} {
		t.Run(c.refusal, func(t *testing.T) {
			var logs testenv.SyncBuffer
			env := newEnv(t, redisStoreOn(t, r.Addr, c.opts), func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
			msg := env.do("GET", "/readyz", "").errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			wantSaid(t, "readyz", msg, &logs, append(c.want, "refuses fenced's connection")...)
			msg = env.do("POST", "/v1/locks/"+testenv.Name(t)+"/acquire", `{"ttl_ms":30000}`).errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			wantSaid(t, "acquire", msg, &logs, c.want...)
			if l := logs.String(); strings.Contains(l, "does not answer") || strings.Contains(l, "is reachable") {
				t.Errorf("Redis answered, with a refusal; the log says it does not, or to check that it is reachable:\n%s", l)
			}
		})
	}
}

// TestEmbeddedMemberCutOffIsNotReady: a fenced node with an embedded etcd
// member talks to that member alone. When the member is cut off from its
// peers, GET /readyz must answer 503 within the ready timeout (a probe's
// own timeout) and keep doing so, so that a load balancer moves the node's
// clients to a node that can serve; and 200 again once the member is back.
// Both stores: the Redis one needs the member for its tokens.
func TestEmbeddedMemberCutOffIsNotReady(t *testing.T) {
	t.Parallel()
	members, peers := testenv.EtcdClusterProxied(t, 3)
	k := slices.IndexFunc(members, func(m *sequencer.Embedded) bool { return !m.IsLeader() })
	cli := testenv.EtcdClient(t, members[k].ClientURL()) // as embeddedClient: the local member only
	es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es.Close() })
	rs, err := lock.NewRedisStore(testenv.Redis(t), newSequencer(t, cli), lock.WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	envs := map[string]*env{"etcd": newEnv(t, es, nil), "redis": newEnv(t, rs, nil)}
	for store, e := range envs {
		if r := e.do("GET", "/readyz", ""); r.status != http.StatusOK {
			t.Fatalf("%s: readyz before the cut: %d %s", store, r.status, r.body)
		}
	}

	heal := testenv.Isolate(members, peers, k)
	t.Cleanup(heal) // heal is idempotent: also when the test stops early
	// Until the member notices (an election timeout) it takes requests and
	// holds them; then it refuses them. Either way: 503 within the bound.
	bound := DefaultReadyTimeout + 500*time.Millisecond
	for store, e := range envs {
		var last string
		testenv.WaitUntil(t, 15*time.Second, func() bool {
			t0 := time.Now()
			r := e.do("GET", "/readyz", "")
			if took := time.Since(t0); took > bound {
				t.Fatalf("%s: readyz with the member cut off answered after %s; bound %s", store, took.Round(time.Millisecond), bound)
			}
			if r.status != http.StatusOK {
				last = r.errCode(t, http.StatusServiceUnavailable, codeUnavailable)
			}
			t.Logf("%s: readyz %d after %s: %s", store, r.status, time.Since(t0).Round(time.Millisecond), last)
			return strings.Contains(last, "no leader")
		})
		// And it stays not ready while the cut lasts.
		for range 5 {
			if r := e.do("GET", "/readyz", ""); r.status != http.StatusServiceUnavailable {
				t.Fatalf("%s: readyz with the member cut off: %d %s", store, r.status, r.body)
			}
		}
		// An acquisition says why it failed, at once.
		_, r := e.acquire(testenv.Name(t), `{"ttl_ms":5000}`)
		if msg := r.errCode(t, http.StatusServiceUnavailable, codeUnavailable); !strings.Contains(msg, "leader") {
			t.Fatalf("%s: acquire with the member cut off: %q, want the missing leader named", store, msg)
		}
	}

	heal()
	for store, e := range envs {
		testenv.WaitUntil(t, 30*time.Second, func() bool { return e.do("GET", "/readyz", "").status == http.StatusOK })
		e.mustAcquire(testenv.Name(t), `{"ttl_ms":5000}`)
		t.Logf("%s: ready again once the member is back", store)
	}
}
