package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestLocksCommand: fenced locks list, get and release against a real
// fenced dev, with the owner fenced exec labels its lock with.
func TestLocksCommand(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)
	prefix := testenv.Name(t) + ":"

	// fenced exec holds one lock with its default owner, the API another.
	holder := start(t, nil, "exec", "--url", url, "--owner", "nightly report", prefix+"report")
	eventually(t, 30*time.Second, "fenced exec holds its lock", func() bool { return a.held(prefix + "report") })
	l := a.acquire(prefix+"other", 30000)

	code, out, stderr := run(t, nil, "locks", "list", "--url", url, "--prefix", prefix)
	if code != 0 {
		t.Fatalf("locks list: exit %d\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(out, prefix+"report") ||
		!strings.Contains(out, "nightly report") || !strings.Contains(out, prefix+"other") {
		t.Fatalf("locks list printed:\n%s", out)
	}

	code, out, stderr = run(t, nil, "locks", "get", "--url", url, prefix+"other", "--json") // flags after NAME too
	var st struct {
		Held  bool   `json:"held"`
		Token uint64 `json:"token"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || !st.Held || st.Token != l.token {
		t.Fatalf("locks get --json: exit %d, %v, %q\n%s", code, err, out, stderr)
	}

	code, out, stderr = run(t, nil, "locks", "release", "--url", url, prefix+"other")
	if code != 0 || !strings.Contains(out, "released "+prefix+"other") {
		t.Fatalf("locks release: exit %d, %q\n%s", code, out, stderr)
	}
	if a.held(prefix + "other") {
		t.Fatal("still held after fenced locks release")
	}
	if code, _, stderr = run(t, nil, "locks", "release", "--url", url, prefix+"other"); code != 1 || !strings.Contains(stderr, "not held") {
		t.Fatalf("release of a free lock: exit %d, want 1 with \"not held\"\n%s", code, stderr)
	}

	// Through an ingress that redirects (http:// to https://): refused,
	// saying where to point the client; it printed "released" of a lock
	// still held, the DELETE followed as a GET.
	a.acquire(prefix+"moved", 30000)
	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, url+r.URL.RequestURI(), http.StatusMovedPermanently)
	}))
	defer moved.Close()
	code, out, stderr = run(t, nil, "locks", "release", "--url", moved.URL, prefix+"moved")
	if code != 1 || !strings.Contains(stderr, "point the client at "+url) || !a.held(prefix+"moved") {
		t.Fatalf("locks release through a redirect: exit %d, %q\n%s", code, out, stderr)
	}

	// --if-token: another token releases nothing; the holder's releases it.
	c := a.acquire(prefix+"cond", 30000)
	other := fmt.Sprint(c.token + 1000)
	code, out, stderr = run(t, nil, "locks", "release", "--url", url, "--if-token", other, prefix+"cond")
	if code != 1 || !strings.Contains(stderr, fmt.Sprintf("held by token %d, not by token %s: nothing released", c.token, other)) || !a.held(prefix+"cond") {
		t.Fatalf("locks release --if-token %s of a lock held by %d: exit %d, %q\n%s", other, c.token, code, out, stderr)
	}
	code, out, stderr = run(t, nil, "locks", "release", "--url", url, "--if-token", fmt.Sprint(c.token), prefix+"cond")
	if code != 0 || !strings.Contains(out, "released "+prefix+"cond: token "+fmt.Sprint(c.token)) || a.held(prefix+"cond") {
		t.Fatalf("locks release --if-token %d: exit %d, %q\n%s", c.token, code, out, stderr)
	}
	code, _, stderr = run(t, nil, "locks", "release", "--url", url, "--if-token", fmt.Sprint(c.token), prefix+"cond")
	if code != 1 || !strings.Contains(stderr, "not held, so not by token") {
		t.Fatalf("locks release --if-token of a free lock: exit %d, want 1 with \"not held\"\n%s", code, stderr)
	}

	for _, args := range [][]string{
		{"locks"},
		{"locks", "release", "--if-token", "0", "x"},
		{"locks", "release", "--if-token", "9223372036854775808", "x"},
		{"locks", "release", "--if-token", "t1", "x"},
		{"locks", "frob"},
		{"locks", "get"},
		{"locks", "get", "a/b"},
		{"locks", "get", "a", "b"},
		{"locks", "get", "a", "--json", "b"},
		{"locks", "list", "--prefix", "a b"},
		{"locks", "list", "--limit", "-1"},
	} {
		if code, _, stderr := run(t, nil, args...); code != 2 || stderr == "" {
			t.Errorf("%q: exit %d, want 2 with a message; stderr %q", args, code, stderr)
		}
	}
	holder.signal(syscall.SIGINT)
	holder.wait(30 * time.Second)
}
