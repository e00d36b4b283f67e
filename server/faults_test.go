package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdWithoutLeader: while the etcd member fenced talks to has no
// leader, a release neither hangs until the backend timeout nor goes
// unlogged: it is a 503 with Retry-After at once, and the log names the
// backend and the time it took.
func TestEtcdWithoutLeader(t *testing.T) {
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.EtcdClient(t, members[0].ClientURL())
	store, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	e := newEnv(t, store, func(c *Config) {
		c.BackendTimeout = time.Hour // a hang would show as a hung test, not a 503
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	name := testenv.Name(t)
	l := e.mustAcquire(name, `{"ttl_ms":30000}`)
	members[1].Close()
	members[2].Close()
	waitFor(t, func() bool {
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
}

// waitFor polls cond until it holds; it fails the test after 30s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		<-tick.C
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
	r.Restart()
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
	for _, want := range []string{"space quota", "etcdctl alarm disarm", "--auto-compaction-retention"} {
		if !strings.Contains(msg, want) {
			t.Errorf("acquire with etcd out of space: %q, want it to say %q", msg, want)
		}
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	if _, err := cli.AlarmDisarm(t.Context(), &clientv3.AlarmMember{MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	env.mustAcquire(testenv.Name(t), `{"ttl_ms":30000}`) // writes again once disarmed
}
