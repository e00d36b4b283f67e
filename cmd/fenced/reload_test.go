package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestScopedTokensReloadOnSIGHUP: a token limited to a prefix gets a 403
// that says which prefixes it has; SIGHUP reloads the token file without a
// restart; a file that does not load keeps the tokens in force, and the
// log says why.
func TestScopedTokensReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	const (
		admin = "admin-token-0123456789abcdef"
		ci    = "ci-token-0123456789abcdef"
	)
	file, write := tokenFile(t)
	write("# operators\n" + admin + "\n" + ci + " name=ci prefixes=build: allow=acquire,inspect\n")
	p, url := startDev(t, []string{"FENCED_AUTH_TOKEN_FILE=" + file})
	asCI := newAPI(t, url).withToken(ci)
	name := testenv.Name(t)

	m := asCI.must(403, "POST", "/v1/locks/prod:"+name+"/acquire", `{"ttl_ms":1000}`)
	e, _ := m["error"].(map[string]any)
	if e["code"] != "forbidden" || e["field"] != "name" || !strings.Contains(e["message"].(string), `must start with "build:"`) {
		t.Fatalf("ci on prod: %v, want a 403 naming the prefix it has", m)
	}
	l := asCI.acquire("build:"+name, 1000)
	asCI.release("build:"+name, l.id)
	asCI.must(403, "GET", "/metrics", "")

	reloaded := func(n int) {
		t.Helper()
		eventually(t, 20*time.Second, "the reload in the log", func() bool {
			return strings.Count(p.stderr.String(), "SIGHUP: auth tokens reloaded") == n
		})
	}
	write(admin + "\n" + ci + " name=ci prefixes=prod: allow=acquire\n")
	p.signal(syscall.SIGHUP)
	reloaded(1)
	l = asCI.acquire("prod:"+name, 1000)
	asCI.release("prod:"+name, l.id)
	asCI.must(403, "POST", "/v1/locks/build:"+name+"/acquire", `{}`)

	// A broken file: the old tokens stay, the log says why.
	write(admin + "\n" + ci + " name=ci allow=acquire,fly\n")
	p.signal(syscall.SIGHUP)
	eventually(t, 20*time.Second, "the failed reload in the log", func() bool {
		return strings.Contains(p.stderr.String(), "auth tokens not reloaded") && strings.Contains(p.stderr.String(), `unknown permission \"fly\"`)
	})
	l = asCI.acquire("prod:"+name, 1000)
	asCI.release("prod:"+name, l.id)
	if strings.Contains(p.stderr.String(), ci) || strings.Contains(p.stderr.String(), admin) {
		t.Fatal("the log shows a token")
	}
}

// TestObserverEndsWhenItsTokenIsRevoked: a token revoked by a reload makes
// the server refuse the observer's next long poll for good. fenced elect
// --observe then says why and exits 1; it used to exit with a message
// built from a nil cause.
func TestObserverEndsWhenItsTokenIsRevoked(t *testing.T) {
	t.Parallel()
	const (
		admin    = "admin-token-0123456789abcdef"
		observer = "observer-token-0123456789abcdef"
	)
	file, write := tokenFile(t)
	write(admin + "\n" + observer + " name=observer allow=inspect\n")
	p, url := startDev(t, []string{"FENCED_AUTH_TOKEN_FILE=" + file})
	name := testenv.Name(t)
	obs := start(t, []string{"FENCED_CLIENT_TOKEN=" + observer}, "elect", "--url", url, "--observe", name)
	if l := obs.line(30 * time.Second); l != "no leader" {
		t.Fatalf("observer's first line %q, want no leader", l)
	}

	write(admin + "\n")
	p.signal(syscall.SIGHUP)
	eventually(t, 20*time.Second, "the reload in the log", func() bool {
		return strings.Contains(p.stderr.String(), "SIGHUP: auth tokens reloaded")
	})
	// A new leader ends the observer's long poll; its next one is refused.
	lead := start(t, []string{"FENCED_CLIENT_TOKEN=" + admin}, "elect", "--url", url, "--value", "a", name, "--", "sleep", "60")
	if code := obs.wait(30 * time.Second); code != 1 {
		t.Fatalf("observer exit %d, want 1", code)
	}
	if msg := obs.stderr.String(); !strings.Contains(msg, "unauthenticated") || strings.Contains(msg, "%!") {
		t.Fatalf("observer's message does not say it was refused:\n%s", msg)
	}
	lead.signal(syscall.SIGTERM)
}

// tokenFile is a token file's path and a function that replaces its
// content whole, as an operator's editor or a Secret update does: a reload
// never sees half a file.
func tokenFile(t *testing.T) (string, func(content string)) {
	file := filepath.Join(t.TempDir(), "tokens")
	return file, func(content string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
}
