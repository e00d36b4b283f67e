package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// waitForGo is a CMD that says it runs (the file started in the directory
// $0), then runs until the file go appears there, then exits with status
// $1: the test takes the lease away while it runs, between two refreshes
// (--ttl 60s refreshes every 20 s), so that only the release finds the
// loss.
const waitForGo = `touch "$0/started"; while [ ! -e "$0/go" ]; do sleep 0.02; done; exit "$1"`

// runsCMD waits until a waitForGo CMD runs: fenced exec (elect) holds the
// lease it runs under.
func runsCMD(t *testing.T, dir string) {
	t.Helper()
	eventually(t, 30*time.Second, "CMD runs", func() bool {
		_, err := os.Stat(filepath.Join(dir, "started"))
		return err == nil
	})
}

// letGo lets a waitForGo CMD finish.
func letGo(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantLostAtRelease fails the test unless p exited 1 saying that the lease
// had been lost before its release, and, with a CMD, its status.
func wantLostAtRelease(t *testing.T, p *proc, status string) {
	t.Helper()
	code := p.wait(30 * time.Second)
	stderr := p.stderr.String()
	if code != 1 || !strings.Contains(stderr, "had been lost before its release") ||
		!strings.Contains(stderr, "may have overlapped another holder's") || !strings.Contains(stderr, status) {
		t.Fatalf("fenced %s: exit %d, stderr %q; want exit 1 saying the lease had been lost before its release (%s)",
			strings.Join(p.cmd.Args[1:], " "), code, stderr, status)
	}
}

// lostRunningCMD runs `fenced VERB NAME -- CMD` (a waitForGo that exits
// with status), takes its lease away while CMD runs (takeAway), lets CMD
// finish, and wants the loss said at the release.
func lostRunningCMD(t *testing.T, url, verb, name, status string, takeAway func(*testing.T, string)) {
	t.Helper()
	dir := t.TempDir()
	p := start(t, nil, verb, "--url", url, "--ttl", "60s", name, "--", "sh", "-c", waitForGo, dir, status)
	runsCMD(t, dir)
	takeAway(t, name)
	letGo(t, dir)
	wantLostAtRelease(t, p, "sh exited (status "+status+")")
}

// lostHolding runs `fenced VERB NAME` without a command, waits for its
// first line (first), takes its lease away, ends it with sig, and wants
// the loss said at the release.
func lostHolding(t *testing.T, url, verb, name, first string, sig syscall.Signal, takeAway func(*testing.T, string)) {
	t.Helper()
	p := start(t, nil, verb, "--url", url, "--ttl", "60s", name)
	if l := p.line(30 * time.Second); !strings.HasPrefix(l, first) {
		t.Fatalf("first line %q, want %s …", l, first)
	}
	takeAway(t, name)
	p.signal(sig)
	wantLostAtRelease(t, p, "writes made with its token")
}

// TestExitLostAtRelease: a lease taken away between two refreshes (an
// operator's fenced locks release, the Redis key gone) is found lost only
// by the release at the end; fenced exec and fenced elect then exit 1 and
// say so, with CMD's status, and not CMD's 0 in silence (defect 138).
func TestExitLostAtRelease(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	forceRelease := func(t *testing.T, name string) {
		t.Helper()
		if code, _, stderr := run(t, nil, "locks", "release", "--url", url, name); code != 0 {
			t.Fatalf("fenced locks release %s: exit %d\n%s", name, code, stderr)
		}
	}

	for _, c := range []struct{ verb, status string }{{"exec", "0"}, {"exec", "3"}, {"elect", "0"}} {
		t.Run(c.verb+c.status, func(t *testing.T) {
			t.Parallel()
			lostRunningCMD(t, url, c.verb, testenv.Name(t), c.status, forceRelease)
		})
	}
	for _, c := range []struct {
		verb, first string
		sig         syscall.Signal
	}{{"exec", "holding lock", syscall.SIGINT}, {"elect", "leading election", syscall.SIGTERM}} {
		t.Run(c.verb+"Hold", func(t *testing.T) {
			t.Parallel()
			lostHolding(t, url, c.verb, testenv.Name(t), c.first, c.sig, forceRelease)
		})
	}

	// The server away at the release is no loss: said, the lease expires
	// after its TTL, and CMD's status stands.
	t.Run("ServerAway", func(t *testing.T) {
		t.Parallel()
		dev, devURL := startDev(t, nil)
		name, dir := testenv.Name(t), t.TempDir()
		p := start(t, nil, "exec", "--url", devURL, "--ttl", "60s", name, "--", "sh", "-c", waitForGo, dir, "0")
		runsCMD(t, dir)
		dev.signal(syscall.SIGKILL)
		<-dev.done
		letGo(t, dir)
		if code := p.wait(30 * time.Second); code != 0 || !strings.Contains(p.stderr.String(), "the lease expires after its TTL") {
			t.Fatalf("exit %d, stderr %q; want 0 and the release's failure said", code, p.stderr.String())
		}
	})
}

// TestExitLostAtReleaseRedis: on Redis leases, the lease's key gone (a
// flush, an eviction, a failover that lost it) between two refreshes.
func TestExitLostAtReleaseRedis(t *testing.T) {
	t.Parallel()
	prefix := testenv.Name(t) + ":"
	_, url := startDev(t, nil, "--redis-addr", testenv.RedisAddr(), "--redis-prefix", prefix)
	rdb := testenv.Redis(t)
	dropKey := func(t *testing.T, name string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if n, err := rdb.Del(ctx, prefix+"{"+name+"}:lease").Result(); err != nil || n != 1 {
			t.Fatalf("DEL the lease key of %s: %d, %v", name, n, err)
		}
	}

	t.Run("Exec", func(t *testing.T) {
		t.Parallel()
		lostRunningCMD(t, url, "exec", "exec", "0", dropKey)
	})
	t.Run("ExecHold", func(t *testing.T) {
		t.Parallel()
		lostHolding(t, url, "exec", "hold", "holding lock", syscall.SIGINT, dropKey)
	})
}
