package server

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEtcdWithoutLeader: while the etcd member fenced talks to has no
// leader, a release neither hangs until the backend timeout nor goes
// unlogged: it is a 503 with Retry-After at once, and the log names the
// backend and the time it took.
func TestEtcdWithoutLeader(t *testing.T) {
	members := testenv.EtcdCluster(t, 3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{members[0].ClientURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
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
