package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// readToken waits for a child to write its FENCED_TOKEN to path.
func readToken(t *testing.T, path string) uint64 {
	t.Helper()
	var tok uint64
	eventually(t, 30*time.Second, "the child writes its token to "+filepath.Base(path), func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		tok, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return err == nil
	})
	return tok
}

// TestElect: two fenced elect processes and an observer against one fenced
// dev. The first leads and its command runs; the second waits without
// running its command; deposing the first (an operator's force-release)
// stops its command and hands the term, higher, to the second, whose
// command runs only then; a third, killed while it waits, leaves the
// queue; the observer prints each leader.
func TestElect(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	name, dir := testenv.Name(t), t.TempDir()

	obs := start(t, nil, "elect", "--url", url, "--observe", name)
	if l := obs.line(30 * time.Second); l != "no leader" {
		t.Fatalf("observer's first line %q, want no leader", l)
	}

	// The child records its term and SIGTERM, then runs until stopped.
	script := `echo "$FENCED_TOKEN" > "$0/$1.tmp" && mv "$0/$1.tmp" "$0/$1"
trap 'echo term > "$0/$1.term"; exit 0' TERM
while :; do sleep 0.05; done`
	first := start(t, nil, "elect", "--url", url, "--value", "host-a:8080", "--ttl", "2s", name, "--", "sh", "-c", script, dir, "a")
	ta := readToken(t, filepath.Join(dir, "a"))
	if l := obs.line(30 * time.Second); l != fmt.Sprintf(`leader term %d value "host-a:8080"`, ta) {
		t.Fatalf("observer printed %q after the first leader (term %d)", l, ta)
	}

	second := start(t, nil, "elect", "--url", url, "--value", "host-b:8080", "--ttl", "2s", name, "--", "sh", "-c", script, dir, "b")
	eventually(t, 30*time.Second, "the second candidate queues", func() bool {
		m := a.must(200, "GET", "/v1/locks/"+name, "")
		w, _ := m["waiters"].(float64)
		return w == 1
	})
	if _, err := os.Stat(filepath.Join(dir, "b")); err == nil {
		t.Fatal("the second candidate's command ran while the first led")
	}
	// A third candidate queues and is killed: its place goes with it.
	third := start(t, nil, "elect", "--url", url, "--ttl", "2s", name, "--", "sh", "-c", script, dir, "c")
	waiters := func(n float64) func() bool {
		return func() bool {
			m := a.must(200, "GET", "/v1/locks/"+name, "")
			w, _ := m["waiters"].(float64)
			return w == n
		}
	}
	eventually(t, 30*time.Second, "the third candidate queues", waiters(2))
	third.signal(syscall.SIGKILL)
	eventually(t, 30*time.Second, "the killed candidate leaves the queue", waiters(1))

	a.must(200, "DELETE", "/v1/locks/"+name, "") // depose the first leader
	if code := first.wait(30 * time.Second); code != 1 {
		t.Fatalf("the deposed leader's fenced elect exited %d, want 1", code)
	}
	if !strings.Contains(first.stderr.String(), "leadership of \""+name+"\" was lost") {
		t.Fatalf("the deposed leader does not say it lost:\n%s", first.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "a.term")); err != nil {
		t.Fatal("the deposed leader's command was not stopped with SIGTERM")
	}
	tb := readToken(t, filepath.Join(dir, "b"))
	if tb <= ta {
		t.Fatalf("term %d after %d", tb, ta)
	}
	for {
		l := obs.line(30 * time.Second)
		if l == "no leader" {
			continue // between the terms, if the observer saw it
		}
		if l != fmt.Sprintf(`leader term %d value "host-b:8080"`, tb) {
			t.Fatalf("observer printed %q after the second leader (term %d)", l, tb)
		}
		break
	}
	second.signal(syscall.SIGTERM)
	if code := second.wait(30 * time.Second); code != 0 {
		t.Fatalf("the second leader exited %d after SIGTERM was passed to its command, want its 0", code)
	}
	if a.held(name) {
		t.Fatal("the election is still led after its leader exited: it did not resign")
	}
}

// TestElectRefusals: a server on Redis leases refuses, saying what to do;
// usage errors exit 2.
func TestElectRefusals(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil, "--redis-addr", testenv.RedisAddr(), "--redis-prefix", testenv.Name(t)+":")
	for _, args := range [][]string{
		{"elect", "--url", url, "e", "--", "true"},
		{"elect", "--url", url, "--observe", "e"},
	} {
		code, _, stderr := run(t, nil, args...)
		// Said once, and what to run instead right for fenced dev too.
		if code != 1 || !strings.Contains(stderr, "--lease-store etcd") || !strings.Contains(stderr, "fenced dev without --redis-addr") ||
			strings.Count(stderr, "elections need") != 1 {
			t.Fatalf("fenced %s on Redis leases: exit %d, stderr:\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"elect"}, "missing the election NAME"},
		{[]string{"elect", "a/b"}, "election NAME"},
		{[]string{"elect", "e", "true"}, "put -- before the command"},
		{[]string{"elect", "--observe", "e", "--", "true"}, "--observe and a command"},
		{[]string{"elect", "--observe", "--value", "v", "e"}, "do not apply"},
		{[]string{"elect", "--ttl", "1us", "e"}, "--ttl"},
		{[]string{"elect", "--value", "", "e"}, "--value"},
	} {
		code, _, stderr := run(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s: exit %d, want 2 with %q; stderr:\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
}
