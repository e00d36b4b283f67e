package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestExec runs fenced exec against one fenced dev.
func TestExec(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)

	t.Run("Environment", func(t *testing.T) {
		t.Parallel()
		name, out := testenv.Name(t), filepath.Join(t.TempDir(), "env")
		code, _, stderr := run(t, nil, "exec", "--url", url, name, "--",
			"sh", "-c", `echo "$FENCED_TOKEN $FENCED_LEASE_ID $FENCED_LOCK" > "$0"`, out)
		if code != 0 {
			t.Fatalf("exit %d, want 0; stderr:\n%s", code, stderr)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		if len(f) != 3 || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(f[1]) || f[2] != name {
			t.Fatalf("child saw %q, want TOKEN LEASE_ID %s", b, name)
		}
		tok, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || tok == 0 {
			t.Fatalf("FENCED_TOKEN %q", f[0])
		}
		if a.held(name) {
			t.Fatal("lock still held after fenced exec exited")
		}
		// The next holder's token is larger.
		if l := a.acquire(name, 1000); l.token <= tok {
			t.Fatalf("token %d after fenced exec's %d", l.token, tok)
		}
	})

	t.Run("ExitStatus", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		if code, _, stderr := run(t, nil, "exec", "--url", url, name, "--", "sh", "-c", "exit 7"); code != 7 {
			t.Fatalf("exit %d, want the child's 7; stderr:\n%s", code, stderr)
		}
		if a.held(name) {
			t.Fatal("lock still held after the child failed")
		}
		if code, _, _ := run(t, nil, "exec", "--url", url, name, "--", "/nonexistent/cmd"); code != 127 {
			t.Fatalf("exit %d for a command that cannot start, want 127", code)
		}
	})

	t.Run("Held", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		a.acquire(name, 10000)
		start := time.Now()
		code, _, stderr := run(t, []string{"FENCED_WAIT=300ms"}, "exec", "--url", url, name, "--", "true")
		if code != 1 || !strings.Contains(stderr, "held") {
			t.Fatalf("exit %d, want 1 with a message that the lock is held; stderr:\n%s", code, stderr)
		}
		if time.Since(start) < 300*time.Millisecond {
			t.Fatal("did not wait --wait (from FENCED_WAIT)")
		}
	})

	t.Run("LostLeaseStopsChild", func(t *testing.T) {
		t.Parallel()
		name, dir := testenv.Name(t), t.TempDir()
		// The child records its lease id, then runs until SIGTERM, which it
		// records and exits 0 on: fenced exec must still exit non-zero.
		script := `trap 'echo term > "$0/term"; exit 0' TERM
echo "$FENCED_LEASE_ID" > "$0/id.tmp" && mv "$0/id.tmp" "$0/id"
while :; do sleep 0.05; done`
		p := start(t, nil, "exec", "--url", url, "--ttl", "2s", "--grace", "10s", name, "--", "sh", "-c", script, dir)
		var id string
		eventually(t, 30*time.Second, "the child writes its lease id", func() bool {
			b, err := os.ReadFile(filepath.Join(dir, "id"))
			id = strings.TrimSpace(string(b))
			return err == nil
		})
		// Steal the lease behind the child's back.
		a.release(name, id)
		code := p.wait(20 * time.Second)
		if code == 0 {
			t.Fatal("fenced exec exited 0 after losing its lease")
		}
		if b, err := os.ReadFile(filepath.Join(dir, "term")); err != nil || strings.TrimSpace(string(b)) != "term" {
			t.Fatalf("child did not get SIGTERM: %v", err)
		}
		if !strings.Contains(p.stderr.String(), "lost") {
			t.Fatalf("stderr does not say the lease was lost:\n%s", p.stderr.String())
		}
	})

	t.Run("KillAfterGrace", func(t *testing.T) {
		t.Parallel()
		name, dir := testenv.Name(t), t.TempDir()
		// The child ignores SIGTERM: SIGKILL must follow after --grace.
		script := `trap '' TERM
echo "$FENCED_LEASE_ID" > "$0/id.tmp" && mv "$0/id.tmp" "$0/id"
while :; do sleep 0.05; done`
		p := start(t, nil, "exec", "--url", url, "--ttl", "2s", "--grace", "200ms", name, "--", "sh", "-c", script, dir)
		var id string
		eventually(t, 30*time.Second, "the child writes its lease id", func() bool {
			b, err := os.ReadFile(filepath.Join(dir, "id"))
			id = strings.TrimSpace(string(b))
			return err == nil
		})
		a.release(name, id)
		if code := p.wait(20 * time.Second); code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		if !strings.Contains(p.stderr.String(), "status 137") {
			t.Fatalf("child not killed (status 137):\n%s", p.stderr.String())
		}
	})

	t.Run("ForwardsSignal", func(t *testing.T) {
		t.Parallel()
		name, dir := testenv.Name(t), t.TempDir()
		script := `trap 'exit 3' TERM
touch "$0/ready"
while :; do sleep 0.05; done`
		p := start(t, nil, "exec", "--url", url, name, "--", "sh", "-c", script, dir)
		eventually(t, 30*time.Second, "the child starts", func() bool {
			_, err := os.Stat(filepath.Join(dir, "ready"))
			return err == nil
		})
		p.signal(syscall.SIGTERM)
		if code := p.wait(20 * time.Second); code != 3 {
			t.Fatalf("exit %d, want the child's 3 after SIGTERM was passed on", code)
		}
		if a.held(name) {
			t.Fatal("lock still held after the child exited")
		}
	})
}

// TestExecLikeEtcdctlLock: fenced exec waits for a held lock by default,
// --try makes one attempt, --wait bounds the wait, and without a command it
// holds the lock until interrupted.
func TestExecLikeEtcdctlLock(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	a := newAPI(t, url)

	t.Run("WaitsByDefault", func(t *testing.T) {
		t.Parallel()
		name, out := testenv.Name(t), filepath.Join(t.TempDir(), "token")
		holder := a.acquire(name, 30000)
		p := start(t, nil, "exec", "--url", url, name, "--", "sh", "-c", `echo "$FENCED_TOKEN" > "$0"`, out)
		eventually(t, 30*time.Second, "fenced exec says it waits", func() bool {
			return strings.Contains(p.stderr.String(), `lock "`+name+`" is held; waiting until it is free`)
		})
		a.release(name, holder.id)
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("exit %d after the holder released, want 0", code)
		}
		b, err := os.ReadFile(out)
		if tok, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil || perr != nil || tok <= holder.token {
			t.Fatalf("the child's token %q (%v), want one above the holder's %d", b, err, holder.token)
		}
	})

	t.Run("Try", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		a.acquire(name, 30000)
		code, _, stderr := run(t, nil, "exec", "--url", url, "--try", name, "--", "true")
		if code != 1 || !strings.Contains(stderr, "--try: one attempt") {
			t.Fatalf("exit %d, want 1 saying one attempt was made; stderr:\n%s", code, stderr)
		}
	})

	t.Run("HoldUntilInterrupted", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		p := start(t, nil, "exec", "--url", url, "--ttl", "2s", name)
		l := p.line(30 * time.Second)
		var tok uint64
		if _, err := fmt.Sscanf(l, "holding lock %q with token %d;", new(string), &tok); err != nil || !strings.HasSuffix(l, "interrupt (Ctrl-C) to release") {
			t.Fatalf("first line %q, want holding lock ... with token ...", l)
		}
		// Held past its TTL: the keep-alive refreshes it.
		m := a.must(200, "GET", "/v1/locks/"+name, "")
		if m["held"] != true || uint64(m["token"].(float64)) != tok {
			t.Fatalf("lock while fenced exec holds it: %v", m)
		}
		p.signal(syscall.SIGINT)
		if code := p.wait(20 * time.Second); code != 0 {
			t.Fatalf("exit %d after SIGINT, want 0", code)
		}
		if a.held(name) {
			t.Fatal("still held after fenced exec was interrupted")
		}
	})

	t.Run("InterruptedWhileWaiting", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		a.acquire(name, 30000)
		p := start(t, nil, "exec", "--url", url, name, "--", "true")
		eventually(t, 30*time.Second, "fenced exec says it waits", func() bool {
			return strings.Contains(p.stderr.String(), "is held; waiting")
		})
		p.signal(syscall.SIGTERM)
		if code := p.wait(20 * time.Second); code != 128+int(syscall.SIGTERM) {
			t.Fatalf("exit %d after SIGTERM while waiting, want %d", code, 128+int(syscall.SIGTERM))
		}
	})

	t.Run("SeveralURLs", func(t *testing.T) {
		t.Parallel()
		dead := testenv.FreeURL(t)
		code, _, stderr := run(t, []string{"FENCED_URL=" + dead + "," + url}, "exec", testenv.Name(t), "--", "true")
		if code != 0 {
			t.Fatalf("exit %d with a dead server first, want 0; stderr:\n%s", code, stderr)
		}
	})
}

// vars are the environment variables of a fenced command's flags, from
// its --help.
func vars(t *testing.T, args ...string) map[string]bool {
	t.Helper()
	_, help, _ := run(t, nil, append(args, "--help")...)
	m := map[string]bool{}
	for _, v := range regexp.MustCompile(`\[\$(FENCED_[A-Z_]+)\]`).FindAllStringSubmatch(help, -1) {
		m[v[1]] = true
	}
	return m
}

// notSecret are variables whose names look like a secret's but are not.
var notSecret = map[string]bool{
	"FENCED_MIN_TOKEN":          true, // admin raise-floor's token number
	"FENCED_ETCD_CLUSTER_TOKEN": true, // the embedded etcd cluster's name
}

// TestExecEnvironment: the child gets the lease's variables and the rest of
// the environment, but none of fenced's secrets; exec's own variables have
// names distinct from serve's and dev's.
func TestExecEnvironment(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, nil)
	out := filepath.Join(t.TempDir(), "env")
	env := []string{
		"FENCED_URL=" + url,
		"FENCED_CLIENT_TOKEN=client-secret-0123456789", // ignored by a dev without tokens; a secret all the same
		"FENCED_AUTH_TOKEN=old-secret-0123456789",
		"FENCED_REDIS_PASSWORD=redis-secret",
		"FENCED_ETCD_PASSWORD=etcd-secret",
		"FENCED_DATABASE_URL=postgres://fence:pg-secret@db:5432/app",
		"FENCED_TOKEN=42", // from an outer fenced exec: replaced
		"KEEP_ME=yes",
	}
	secrets := []string{"client-secret", "old-secret", "redis-secret", "etcd-secret", "pg-secret", "FENCED_TOKEN=42\n"}
	// Every other command's variable that holds a secret, or names the
	// file of one, found by its name: fenced exec does not read them.
	// exec's own (FENCED_CLIENT_TOKEN_FILE, FENCED_CLIENT_TLS_KEY) name
	// files it would open, so only FENCED_CLIENT_TOKEN of them is set.
	execVars := vars(t, "exec")
	secretName := regexp.MustCompile(`PASSWORD|TOKEN|_KEY$|DATABASE_URL`)
	for _, c := range [][]string{{"serve"}, {"dev"}, {"elect"}, {"locks", "list"}, {"admin", "raise-floor"}, {"admin", "pg-migrate"}} {
		for v := range vars(t, c...) {
			set := slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, v+"=") })
			if execVars[v] || notSecret[v] || set || !secretName.MatchString(v) {
				continue
			}
			secret := "secret-of-" + strings.ToLower(v)
			env, secrets = append(env, v+"="+secret), append(secrets, secret)
		}
	}
	if !slices.Contains(secrets, "secret-of-fenced_tls_key") || !slices.Contains(secrets, "secret-of-fenced_redis_tls_key") {
		t.Fatalf("secrets %q: --help no longer lists the variables looked for", secrets)
	}
	name := testenv.Name(t)
	code, _, stderr := run(t, env, "exec", name, "--", "sh", "-c", `env > "$0"`, out)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, secret := range secrets {
		if strings.Contains(got, secret) {
			t.Errorf("the child sees %q", secret)
		}
	}
	for _, want := range []string{"KEEP_ME=yes\n", "FENCED_LOCK=" + name + "\n", "FENCED_URL=" + url + "\n", "FENCED_LEASE_ID=", "FENCED_TOKEN="} {
		if !strings.Contains(got, want) {
			t.Errorf("the child lacks %q", want)
		}
	}

	if !execVars["FENCED_URL"] || !execVars["FENCED_CLIENT_TOKEN"] || len(execVars) < 10 {
		t.Fatalf("exec's variables %v", execVars)
	}
	for _, daemon := range [][]string{{"serve"}, {"dev"}} {
		for v := range vars(t, daemon...) {
			if execVars[v] {
				t.Errorf("%s is a variable of both fenced exec and fenced %s", v, daemon[0])
			}
		}
	}
	for _, child := range []string{"FENCED_TOKEN", "FENCED_LEASE_ID", "FENCED_LOCK"} {
		if execVars[child] {
			t.Errorf("%s, which the child gets, is also a variable of fenced exec", child)
		}
	}
}
