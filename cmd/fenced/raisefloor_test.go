package main_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// TestRaiseFloorAtStart restores the data dir of fenced dev's embedded
// member from a snapshot, as an operator restores that of fenced serve
// --etcd-data-dir (the StatefulSet in deploy/). etcd then runs only inside
// fenced, which serves as soon as its member is up: `fenced admin
// raise-floor` cannot run first, and the first acquisition got a token
// issued before the restore (defect 161). --raise-floor raises the floor
// before the listener opens.
func TestRaiseFloorAtStart(t *testing.T) {
	t.Parallel()
	const name = "restored"
	dir := t.TempDir()
	p, url := startDev(t, nil, "--data-dir", filepath.Join(dir, "member"))
	etcdURL := devEtcdURL(t, p)
	a := newAPI(t, url)
	take := func(a *api) uint64 {
		t.Helper()
		l := a.acquire(name, 5000)
		a.release(name, l.id)
		return l.token
	}
	for i := 0; i < 3; i++ {
		take(a)
	}
	snap := filepath.Join(dir, "snap.db")
	if _, err := snapshot.NewV3(zap.NewNop()).Save(t.Context(), clientv3.Config{Endpoints: []string{etcdURL}, Logger: zap.NewNop()}, snap); err != nil {
		t.Fatal(err)
	}
	var max uint64
	for i := 0; i < 8; i++ {
		max = take(a)
	}
	t.Logf("highest token of %s before the restore: %d", name, max)
	p.signal(syscall.SIGTERM)
	if code := p.wait(30 * time.Second); code != 0 {
		t.Fatalf("fenced dev exited %d on SIGTERM", code)
	}

	// restored is a new data dir restored from snap, as etcdutl snapshot
	// restore makes it for the member fenced dev and serve run: named
	// fenced, cluster token fenced.
	restored := func(t *testing.T) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "restored")
		peer := testenv.FreeURL(t)
		if err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath: snap, Name: "fenced", OutputDataDir: out,
			PeerURLs: []string{peer}, InitialCluster: "fenced=" + peer, InitialClusterToken: "fenced",
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}

	// Without the flag: the restored member issues a token issued before.
	// This is why --raise-floor exists; should it stop repeating, the test
	// no longer exercises a restore.
	t.Run("Control", func(t *testing.T) {
		t.Parallel()
		_, url := startDev(t, nil, "--data-dir", restored(t))
		tok := take(newAPI(t, url))
		t.Logf("first token after the restore, without --raise-floor: %d (highest before: %d)", tok, max)
		if tok > max {
			t.Fatalf("first token after the restore without --raise-floor is %d, above %d: the setup no longer reproduces a restore", tok, max)
		}
	})

	t.Run("Dev", func(t *testing.T) {
		t.Parallel()
		p, url := startDev(t, nil, "--data-dir", restored(t), "--raise-floor")
		tok := take(newAPI(t, url))
		t.Logf("first token after the restore, fenced dev --raise-floor: %d (highest before: %d)", tok, max)
		if tok <= max {
			t.Fatalf("first token after the restore with --raise-floor is %d, not above %d issued before", tok, max)
		}
		if !strings.Contains(p.stderr.String(), "token floor raised before serving") {
			t.Fatalf("no log line of the raise:\n%s", p.stderr.String())
		}
	})

	// fenced serve with an embedded member, the flags from the environment
	// as a deployment sets them, and a minimum far above the clock.
	t.Run("ServeFromEnv", func(t *testing.T) {
		t.Parallel()
		min := uint64(time.Now().UnixMicro()) + 1e12
		env := []string{"FENCED_RAISE_FLOOR=true", fmt.Sprint("FENCED_MIN_TOKEN=", min)}
		p := start(t, env, "serve", "--listen", "127.0.0.1:0", "--lease-store", "etcd",
			"--etcd-data-dir", restored(t), "--etcd-unsafe-no-fsync")
		tok := take(newAPI(t, p.listening()))
		t.Logf("first token after the restore, fenced serve with FENCED_RAISE_FLOOR=true FENCED_MIN_TOKEN=%d: %d (highest before: %d)", min, tok, max)
		if tok <= max || tok <= min {
			t.Fatalf("first token after the restore with --raise-floor --min-token %d is %d, want above it and above %d issued before", min, tok, max)
		}
	})
}

// devEtcdURL reads fenced dev's stdout after its first line up to the line
// "etcd: URL (...)", and returns URL.
func devEtcdURL(t *testing.T, p *proc) string {
	t.Helper()
	for {
		l := p.line(30 * time.Second)
		if rest, ok := strings.CutPrefix(l, "etcd: "); ok {
			u, _, _ := strings.Cut(rest, " ")
			return u
		}
	}
}

// TestRaiseFloorUsage: --min-token goes with --raise-floor, and stays
// below 2^63 as fenced admin raise-floor's does.
func TestRaiseFloorUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serve := []string{"serve", "--listen", "127.0.0.1:0", "--lease-store", "etcd", "--etcd-data-dir", dir}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"dev", "--min-token", "5"}, "--min-token goes with --raise-floor"},
		{nil, slices.Concat(serve, []string{"--min-token", "5"}), "--min-token goes with --raise-floor"},
		{[]string{"FENCED_MIN_TOKEN=5"}, serve, "give both, or drop --min-token; --min-token is set by $FENCED_MIN_TOKEN"},
		{[]string{"FENCED_RAISE_FLOOR=false"}, []string{"dev", "--min-token", "5"}, "--min-token goes with --raise-floor"},
		{nil, []string{"dev", "--raise-floor", "--min-token", "9223372036854775808"}, "--min-token 9223372036854775808: above 2^62"},
		{[]string{"FENCED_RAISE_FLOOR=true"}, slices.Concat(serve, []string{"--min-token", "9223372036854775808"}), "--min-token 9223372036854775808: above 2^62"},
		{nil, []string{"dev", "--raise-floor", "--min-token", "-1"}, "want a decimal token"},
		{[]string{"FENCED_RAISE_FLOOR=maybe"}, []string{"dev"}, "FENCED_RAISE_FLOOR"},
	} {
		code, _, stderr := run(t, c.env, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s (env %v): exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), c.env, code, stderr, c.want)
		}
	}
}

// TestRaiseFloorFailsForGood: a minimum that leaves no token below 2^63
// ends fenced with the error; it never serves without the raise. It is
// now refused with the flags, as is any minimum above 2^62
// (sequencer.MaxMinToken, TestAdminRaiseFloorRefusesAHugeMin).
func TestRaiseFloorFailsForGood(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := run(t, nil, "dev", "--listen", "127.0.0.1:0", "--raise-floor", "--min-token", "9223372036854775806")
	if code != 2 || !strings.Contains(stderr, "--min-token 9223372036854775806: above 2^62") || strings.Contains(stdout, "listening") {
		t.Fatalf("fenced dev --raise-floor --min-token 2^63-2: exit %d, stdout %q, stderr:\n%s\nwant exit 2 with the error, never listening", code, stdout, stderr)
	}
}

// TestRaiseFloorWaitsForEtcd: the raise waits for an etcd that does not
// answer yet, saying so, as the start always did for the floor of a new
// cluster; fenced serves only once it is raised.
func TestRaiseFloorWaitsForEtcd(t *testing.T) {
	t.Parallel()
	etcd := testenv.FreeURL(t) // nothing listens there yet
	p := start(t, nil, "serve", "--listen", "127.0.0.1:0", "--lease-store", "etcd", "--etcd-endpoints", etcd, "--raise-floor")
	eventually(t, 30*time.Second, "the log line that fenced waits for etcd", func() bool {
		return strings.Contains(p.stderr.String(), "fenced waits for it before serving")
	})
	if strings.Contains(p.stderr.String(), "fenced serve ready") {
		t.Fatalf("fenced serve is ready before etcd answered:\n%s", p.stderr.String())
	}
	e, err := sequencer.StartEmbedded(t.Context(), sequencer.EmbedConfig{ClientURL: etcd, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	a := newAPI(t, p.listening())
	if !strings.Contains(p.stderr.String(), "token floor raised before serving") {
		t.Fatalf("serving without the raise's log line:\n%s", p.stderr.String())
	}
	if tok := a.acquire(testenv.Name(t), 5000).token; tok < uint64(time.Now().Add(-time.Hour).UnixMicro()) {
		t.Fatalf("token %d after the raise, want above the clock in µs at the start", tok)
	}
}
