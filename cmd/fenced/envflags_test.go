package main_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// TestEnvLosesToExcludingFlag: a flag on the command line overrides the
// environment's variable of a flag it cannot be given with, as it does its
// own; an empty variable counts as unset. Each of these exited 2 (defect
// 139).
func TestEnvLosesToExcludingFlag(t *testing.T) {
	t.Parallel()
	file, write := tokenFile(t)
	const secret = "client-token-0123456789abcdef"
	write(secret + "\n")
	_, url := startDev(t, []string{"FENCED_AUTH_TOKEN_FILE=" + file})
	a := newAPI(t, url).withToken(secret)
	auth := "FENCED_CLIENT_TOKEN_FILE=" + file

	t.Run("TryOverWait", func(t *testing.T) {
		t.Parallel()
		for _, wait := range []string{"30s", "0s"} {
			name := testenv.Name(t)
			env := []string{auth, "FENCED_WAIT=" + wait}
			if code, _, stderr := run(t, env, "exec", "--url", url, "--try", name, "--", "true"); code != 0 {
				t.Errorf("FENCED_WAIT=%s fenced exec --try on a free lock: exit %d, want 0; stderr:\n%s", wait, code, stderr)
				continue
			}
			// --try, not the variable's wait: one attempt on a held lock.
			a.acquire(name, 60000)
			start := time.Now()
			code, _, stderr := run(t, env, "exec", "--url", url, "--try", name, "--", "true")
			if code != 1 || !strings.Contains(stderr, "--try: one attempt") || time.Since(start) > 20*time.Second {
				t.Fatalf("FENCED_WAIT=%s fenced exec --try on a held lock: exit %d after %s, want 1 at once; stderr:\n%s", wait, code, time.Since(start), stderr)
			}
		}
	})

	t.Run("WaitOverTry", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		env := []string{auth, "FENCED_TRY=true"}
		if code, _, stderr := run(t, env, "exec", "--url", url, "--wait", "5s", name, "--", "true"); code != 0 {
			t.Fatalf("FENCED_TRY=true fenced exec --wait 5s: exit %d, want 0; stderr:\n%s", code, stderr)
		}
		// --wait, not the variable's --try: a wait on a held lock.
		a.acquire(name, 60000)
		code, _, stderr := run(t, env, "exec", "--url", url, "--wait", "300ms", name, "--", "true")
		if code != 1 || !strings.Contains(stderr, "still held by another holder after --wait 300ms") {
			t.Fatalf("FENCED_TRY=true fenced exec --wait 300ms on a held lock: exit %d, want 1 after the wait; stderr:\n%s", code, stderr)
		}
	})

	t.Run("TokenFileOverToken", func(t *testing.T) {
		t.Parallel()
		env := []string{"FENCED_CLIENT_TOKEN=wrong-token-0123456789abcdef"}
		for _, args := range [][]string{
			{"locks", "list", "--url", url, "--client-token-file", file},
			{"locks", "get", "--url", url, "absent", "--client-token-file", file}, // a flag after NAME, parsed again
		} {
			if code, _, stderr := run(t, env, args...); code != 0 {
				t.Errorf("FENCED_CLIENT_TOKEN=… fenced %s: exit %d, want 0 with the file's token; stderr:\n%s", strings.Join(args, " "), code, stderr)
			}
		}
		// And the other way round: the token over the variable's file.
		env = []string{"FENCED_CLIENT_TOKEN_FILE=" + filepath.Join(t.TempDir(), "absent")}
		if code, _, stderr := run(t, env, "locks", "list", "--url", url, "--client-token", secret); code != 0 {
			t.Errorf("FENCED_CLIENT_TOKEN_FILE=… fenced locks list --client-token: exit %d, want 0; stderr:\n%s", code, stderr)
		}
	})

	t.Run("ObserveOverCampaign", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		p := start(t, []string{auth, "FENCED_TTL=30s", "FENCED_VALUE=host-a"}, "elect", "--url", url, "--observe", name)
		if l := p.line(30 * time.Second); l != "no leader" {
			t.Fatalf("FENCED_TTL=30s FENCED_VALUE=… fenced elect --observe: first line %q, want no leader", l)
		}
		code, _, stderr := run(t, []string{auth, "FENCED_OBSERVE=true"}, "elect", "--url", url, "--value", "host-b", name, "--", "true")
		if code != 0 {
			t.Fatalf("FENCED_OBSERVE=true fenced elect --value … -- true: exit %d, want 0; stderr:\n%s", code, stderr)
		}
	})

	// Two variables that exclude each other, or two flags, are refused as
	// before, naming the variables.
	t.Run("StillRefused", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			env  []string
			args []string
			want string
		}{
			{[]string{"FENCED_TRY=true", "FENCED_WAIT=1s"}, []string{"exec", "demo"}, "--try and --wait: --try makes one attempt, --wait bounds a wait; give one; --try is set by $FENCED_TRY, --wait is set by $FENCED_WAIT"},
			{[]string{"FENCED_WAIT=1s"}, []string{"exec", "--try", "--wait", "2s", "demo"}, "--try and --wait"},
			{[]string{"FENCED_CLIENT_TOKEN=x", "FENCED_CLIENT_TOKEN_FILE=" + file}, []string{"locks", "list"}, "--client-token and --client-token-file: give one"},
			{nil, []string{"locks", "list", "--client-token", "x", "--client-token-file", file}, "--client-token and --client-token-file: give one"},
			{[]string{"FENCED_OBSERVE=true", "FENCED_TTL=5s"}, []string{"elect", "e"}, "do not apply"},
			{[]string{"FENCED_LEASE_STORE=etcd", "FENCED_REDIS_ADDR=a:1", "FENCED_ETCD_ENDPOINTS=http://a:1"}, []string{"serve"}, "--redis-addr is set, but --lease-store=etcd"},
			{[]string{"FENCED_REDIS_PREFIX=x:"}, []string{"dev"}, "--redis-prefix is set by $FENCED_REDIS_PREFIX"},
		} {
			code, _, stderr := run(t, c.env, c.args...)
			if code != 2 || !strings.Contains(stderr, c.want) {
				t.Errorf("fenced %s (env %v): exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), c.env, code, stderr, c.want)
			}
		}
	})
}

// TestEnvLosesToExcludingFlagServers: fenced serve and fenced dev start
// with the variables of flags the command line excludes, or empty ones,
// in their environment (defect 139).
func TestEnvLosesToExcludingFlagServers(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	serve := func(t *testing.T, env []string, args ...string) {
		t.Helper()
		args = append([]string{"serve", "--listen", "127.0.0.1:0", "--etcd-prefix", "/" + testenv.Name(t) + "/"}, args...)
		p := start(t, env, args...)
		newAPI(t, p.listening()).must(200, "GET", "/readyz", "")
	}

	t.Run("EmptyRedisAddr", func(t *testing.T) {
		t.Parallel()
		serve(t, []string{"FENCED_REDIS_ADDR="}, "--lease-store", "etcd", "--etcd-endpoints", e.ClientURL())
	})
	t.Run("LeaseStoreOverRedis", func(t *testing.T) {
		t.Parallel()
		serve(t, []string{"FENCED_REDIS_ADDR=127.0.0.1:1", "FENCED_REDIS_PREFIX=x:"}, "--lease-store", "etcd", "--etcd-endpoints", e.ClientURL())
	})
	t.Run("RedisOverLeaseStore", func(t *testing.T) {
		t.Parallel()
		serve(t, []string{"FENCED_LEASE_STORE=etcd"}, "--redis-addr", testenv.RedisAddr(), "--redis-prefix", testenv.Name(t)+":", "--etcd-endpoints", e.ClientURL())
	})
	t.Run("EndpointsOverDataDir", func(t *testing.T) {
		t.Parallel()
		serve(t, []string{"FENCED_ETCD_DATA_DIR=" + t.TempDir(), "FENCED_ETCD_NAME=n1"}, "--lease-store", "etcd", "--etcd-endpoints", e.ClientURL())
	})
	t.Run("DataDirOverEndpoints", func(t *testing.T) {
		t.Parallel()
		serve(t, []string{"FENCED_ETCD_ENDPOINTS=http://127.0.0.1:1", "FENCED_ETCD_DIAL_TIMEOUT=1s"},
			"--lease-store", "etcd", "--etcd-data-dir", t.TempDir(), "--etcd-unsafe-no-fsync")
	})
	t.Run("EmptyRedisPrefix", func(t *testing.T) {
		t.Parallel()
		_, url := startDev(t, []string{"FENCED_REDIS_PREFIX="})
		newAPI(t, url).must(200, "GET", "/readyz", "")
	})
	t.Run("EmptyVariables", func(t *testing.T) {
		t.Parallel()
		// An empty variable is no value: --owner's default, not a label
		// refused as empty.
		_, url := startDev(t, nil)
		name := testenv.Name(t)
		if code, _, stderr := run(t, []string{"FENCED_URL=" + url, "FENCED_OWNER=", "FENCED_TTL="}, "exec", name, "--", "true"); code != 0 {
			t.Fatalf("FENCED_OWNER= FENCED_TTL= fenced exec: exit %d, want 0; stderr:\n%s", code, stderr)
		}
	})
}
