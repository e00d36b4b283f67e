package main_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDataDirInUse: fenced dev --data-dir, or serve --etcd-data-dir, on a
// dir another fenced runs on exits at once, saying so and naming the
// flag, rather than wait silently, deaf to Ctrl-C, until the other stops
// (defect 140).
func TestDataDirInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, url := startDev(t, nil, "--data-dir", dir)
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--data-dir", []string{"dev", "--listen", "127.0.0.1:0", "--data-dir", dir}},
		{"--etcd-data-dir", []string{"serve", "--lease-store", "etcd", "--listen", "127.0.0.1:0", "--etcd-data-dir", dir}},
	} {
		second := start(t, nil, c.args...)
		code := second.wait(20 * time.Second) // it waited as long as the first ran
		stderr := second.stderr.String()
		want := fmt.Sprintf("%s %q is in use by ", c.flag, dir)
		if code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "stop that process, or give another "+c.flag) {
			t.Errorf("fenced %s on a dir in use: exit %d, stderr:\n%s\nwant non-zero, with %q", strings.Join(c.args, " "), code, stderr, want)
		}
		if runtime.GOOS == "linux" && !strings.Contains(stderr, fmt.Sprintf("process %d (", first.cmd.Process.Pid)) {
			t.Errorf("stderr:\n%s\nwant it to name the first fenced, pid %d", stderr, first.cmd.Process.Pid)
		}
	}
	newAPI(t, url).acquire("still-serving", 5000) // the first is untouched
}

// TestEtcdEndpointsScheme: --etcd-endpoints with a scheme etcd is not
// reached by (a typo, unix://) is a usage error at once, not a wait until
// --timeout, or for ever in serve (defect 141). host:port is still taken.
func TestEtcdEndpointsScheme(t *testing.T) {
	t.Parallel()
	for _, ep := range []string{"htp://127.0.0.1:41541", "ftp://127.0.0.1:41541", "unix://127.0.0.1:41541", "unixs://127.0.0.1:41541", "http://127.0.0.1:41541,htps://127.0.0.1:41542"} {
		for _, args := range [][]string{
			{"admin", "floor", "--etcd-endpoints", ep, "--timeout", "3s"},
			{"admin", "raise-floor", "--etcd-endpoints", ep, "--min-token", "5", "--timeout", "3s"},
			{"serve", "--lease-store", "etcd", "--listen", "127.0.0.1:0", "--etcd-endpoints", ep},
		} {
			p := start(t, nil, args...)
			code := p.wait(20 * time.Second) // serve waited for ever
			stderr := p.stderr.String()
			if code != 2 || !strings.Contains(stderr, "--etcd-endpoints") || !strings.Contains(stderr, "is neither http nor https: want http://host:port, https://host:port or host:port") {
				t.Errorf("fenced %s: exit %d, stderr:\n%s\nwant 2, refusing the scheme", strings.Join(args, " "), code, stderr)
			}
		}
	}
	// A bare host:port is an endpoint still: the command tries it.
	code, _, stderr := run(t, nil, "admin", "floor", "--etcd-endpoints", "127.0.0.1:1", "--timeout", "1s")
	if code != 1 || !strings.Contains(stderr, "deadline exceeded") {
		t.Errorf("admin floor --etcd-endpoints 127.0.0.1:1: exit %d, stderr:\n%s\nwant 1 after trying it", code, stderr)
	}
}

// TestAddressPasswordHidden: an etcd endpoint or a Redis address with a
// password is refused without printing it (defect 162: both were quoted
// whole, and the etcd endpoint was taken, its user and password ignored).
func TestAddressPasswordHidden(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"serve", "--lease-store", "etcd", "--listen", "127.0.0.1:0", "--etcd-endpoints", "http://bob:hunter2@127.0.0.1:2379"},
		{"serve", "--lease-store", "etcd", "--listen", "127.0.0.1:0", "--etcd-endpoints", "http://127.0.0.1:2379,http://bob:hunter2@127.0.0.1:99999"},
		{"admin", "floor", "--etcd-endpoints", "bob:hunter2@127.0.0.1:2379", "--timeout", "3s"},
		{"serve", "--listen", "127.0.0.1:0", "--redis-addr", "redis://bob:hunter2@127.0.0.1:6379", "--etcd-endpoints", "127.0.0.1:2379"},
		{"locks", "list", "--url", "http://bob:hunter2@127.0.0.1:1"},
	} {
		p := start(t, nil, args...)
		code := p.wait(20 * time.Second)
		stderr := p.stderr.String()
		if code != 2 || strings.Contains(stderr, "hunter2") || !strings.Contains(stderr, "bob:xxxxx@") {
			t.Errorf("fenced %s: exit %d, stderr:\n%s\nwant 2, the address refused with its password hidden", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestEmbeddedURLScheme: the embedded member's URL flags take http://
// only, at once (defect 141: they did already).
func TestEmbeddedURLScheme(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--etcd-client-url", []string{"dev", "--etcd-client-url", "ftp://127.0.0.1:23790"}},
		{"--etcd-listen-client-url", []string{"dev", "--etcd-client-url", "http://127.0.0.1:23790", "--etcd-listen-client-url", "htp://127.0.0.1:23790"}},
		{"--etcd-client-url", []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-client-url", "unix://127.0.0.1:23790"}},
		{"--etcd-peer-url", []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "htp://127.0.0.1:23800"}},
		{"--etcd-listen-peer-url", []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "http://127.0.0.1:23800", "--etcd-listen-peer-url", "ftp://0.0.0.0:23800"}},
		{"--etcd-initial-cluster", []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "http://127.0.0.1:23800",
			"--etcd-initial-cluster", "fenced=http://127.0.0.1:23800,b=ftp://127.0.0.1:23801"}},
	} {
		code, _, stderr := run(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.flag+" ") || !strings.Contains(stderr, "want http://host:port") {
			t.Errorf("fenced %s: exit %d, stderr:\n%s\nwant 2, refusing the scheme of %s", strings.Join(c.args, " "), code, stderr, c.flag)
		}
	}
}
