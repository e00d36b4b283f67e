package main_test

import (
	"net"
	"strings"
	"testing"
)

// TestUsageErrors: invalid flags, environment values and arguments exit 2
// with a message that names what is wrong.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "missing the command"},
		{nil, []string{"bogus"}, `unknown command "bogus"`},
		{nil, []string{"dev", "--nope"}, "--nope"},
		{nil, []string{"dev", "--max-ttl", "abc"}, "--max-ttl"},
		{nil, []string{"dev", "--max-ttl", "48h"}, "--max-ttl"},
		{nil, []string{"dev", "--max-body-bytes", "1k"}, "--max-body-bytes"},
		{nil, []string{"dev", "--max-body-bytes", "10"}, "--max-body-bytes 10: want at least 4096"},
		// A token no server holds names where it came from (defect 208).
		{[]string{"FENCED_CLIENT_TOKEN=short"}, []string{"locks", "list", "--url", "http://127.0.0.1:1"}, "--client-token: client: bearer token of 5 bytes; want at least 16 bytes"},
		{nil, []string{"dev", "--ready-timeout", "0s"}, "--ready-timeout"},
		// Not the server's "(0 means …)": the flags refuse 0.
		{nil, []string{"dev", "--max-wait", "-1s"}, "--max-wait -1s: want > 0 (run"},
		{[]string{"FENCED_MAX_TTL=abc"}, []string{"dev"}, "FENCED_MAX_TTL"},
		{[]string{"FENCED_LISTEN=nonsense"}, []string{"dev"}, "--listen"},
		// A value from the environment is found by its variable: the
		// message names the flag, and which variable set it.
		{[]string{"FENCED_LISTEN=localhost"}, []string{"dev"}, "--listen is set by $FENCED_LISTEN"},
		{[]string{"FENCED_MAX_TTL=1ms"}, []string{"serve"}, "want 10ms to 24h0m0s; --max-ttl is set by $FENCED_MAX_TTL"},
		// A port that is no port: refused at once, not after the backends
		// answered (and never, while etcd did not).
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--listen", "127.0.0.1:99999"}, "want a number from 0 to 65535"},
		{nil, []string{"dev", "--listen", "127.0.0.1:abc"}, "want a number from 0 to 65535"},
		{nil, []string{"dev", "--tls-cert", "x.pem"}, "--tls-key"},
		{nil, []string{"dev", "--tls-client-ca", "ca.pem"}, "--tls-client-ca"},
		{nil, []string{"dev", "--log-level", "loud"}, "--log-level"},
		{nil, []string{"dev", "--log-format", "xml"}, "--log-format"},
		{nil, []string{"dev", "extra"}, `unexpected argument "extra"`},
		{nil, []string{"dev", "--etcd-prefix", "fenced"}, "--etcd-prefix"},
		{nil, []string{"serve", "--lease-store", "memcached"}, "--lease-store"},
		{nil, []string{"serve", "--etcd-endpoints", "http://127.0.0.1:2379"}, "--redis-addr"},
		{nil, []string{"serve", "--lease-store", "etcd"}, "--etcd-endpoints"},
		{nil, []string{"serve", "--lease-store", "etcd", "--redis-addr", "a:1", "--etcd-endpoints", "http://a:1"}, "--redis-addr"},
		{nil, []string{"serve", "--redis-addr", "a:1", "--redis-cluster-addrs", "b:1", "--etcd-endpoints", "http://a:1"}, "only one"},
		{nil, []string{"serve", "--redis-sentinel-addrs", "a:1", "--etcd-endpoints", "http://a:1"}, "--redis-master"},
		{nil, []string{"serve", "--redis-addr", "nohost", "--etcd-endpoints", "http://a:1"}, "--redis-addr"},
		// Refused before the wait for etcd, not after, with every script
		// failing CROSSSLOT on a Cluster (defect 200).
		{nil, []string{"serve", "--redis-addr", "a:1", "--etcd-endpoints", "http://a:1", "--redis-prefix", "{}"}, `--redis-prefix: Redis key prefix "{}" has a brace; want none`},
		{nil, []string{"dev", "--redis-addr", "a:1", "--redis-prefix", "app{x}:"}, "--redis-prefix"},
		{nil, []string{"serve", "--redis-addr", "a:1", "--etcd-endpoints", "nohost"}, "--etcd-endpoints"},
		{[]string{"FENCED_REDIS_TLS=maybe"}, []string{"serve"}, "FENCED_REDIS_TLS"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-endpoints", "http://a:1", "--etcd-data-dir", dir}, "give one"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-endpoints", "http://a:1", "--etcd-name", "x"}, "--etcd-name"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-ca", "ca.pem"}, "--etcd-ca"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-name", "c",
			"--etcd-peer-url", "http://127.0.0.1:1", "--etcd-initial-cluster", "a=http://127.0.0.1:1,b=http://127.0.0.1:2"}, "does not list"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-initial-cluster-state", "maybe"}, "--etcd-initial-cluster-state"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "https://127.0.0.1:1"}, "--etcd-peer-url"},
		// etcd binds IP addresses only: a host name is where a member is
		// reached, with a listen URL beside it; 0.0.0.0 is where it listens.
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "http://fenced-1:2380"}, `--etcd-peer-url "http://fenced-1:2380": etcd listens on IP addresses only: keep the name here, where this member is reached, and give --etcd-listen-peer-url http://0.0.0.0:PORT`},
		{nil, []string{"dev", "--etcd-client-url", "http://fenced-1:2379"}, "give --etcd-listen-client-url http://0.0.0.0:PORT"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "http://fenced-1:2380", "--etcd-listen-peer-url", "http://fenced-1:2380"},
			`--etcd-listen-peer-url "http://fenced-1:2380": want an IP address (0.0.0.0 for every interface) or localhost`},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-listen-client-url", "http://0.0.0.0:2379"}, "--etcd-listen-client-url needs --etcd-client-url"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-client-url", "http://[::]:2379", "--etcd-listen-client-url", "http://[::]:2379"},
			`--etcd-client-url "http://[::]:2379": nothing reaches ::`},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-peer-url", "http://a:1", "--etcd-listen-peer-url", "https://0.0.0.0:1"}, `--etcd-listen-peer-url "https://0.0.0.0:1": want http://`},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-endpoints", "http://a:1", "--etcd-listen-peer-url", "http://0.0.0.0:1"}, "--etcd-listen-peer-url"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-name", "a", "--etcd-peer-url", "http://0.0.0.0:1",
			"--etcd-initial-cluster", "a=http://0.0.0.0:1,b=http://10.0.0.2:2380"}, "member a at http://0.0.0.0:1: the other members cannot reach 0.0.0.0"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-election-timeout", "200ms"}, "--etcd-election-timeout"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir, "--etcd-compaction-retention", "0"}, "--etcd-compaction-retention 0s: want > 0"},
		{nil, []string{"serve", "--lease-store", "etcd", "--etcd-endpoints", "http://a:1", "--etcd-compaction-retention", "5m"}, "--etcd-compaction-retention"},
		{nil, []string{"exec"}, "NAME"},
		{nil, []string{"exec", "demo", "true"}, "put -- before the command"},
		{nil, []string{"exec", "--try", "--wait", "1s", "demo"}, "--try and --wait"},
		{[]string{"FENCED_TRY=true", "FENCED_WAIT=1s"}, []string{"exec", "demo"}, "--try and --wait"}, // a command-line flag beats a variable (defect 139)
		{nil, []string{"exec", "--client-tls-cert", "c.pem", "demo"}, "--client-tls-key"},
		{nil, []string{"dev", "--redis-prefix", "x:"}, "--redis-addr"},
		{nil, []string{"dev", "--default-ttl", "1ms"}, "--default-ttl 1ms: want 10ms to 24h"},
		// 0 is not the server's default (24h, 30s) in disguise: it is refused.
		{nil, []string{"dev", "--max-ttl", "0"}, "--max-ttl 0s: want 10ms to 24h"},
		{nil, []string{"serve", "--max-ttl", "0"}, "--max-ttl 0s: want 10ms to 24h"},
		{nil, []string{"serve", "--max-ttl", "-1s"}, "--max-ttl -1s: want 10ms to 24h"},
		{nil, []string{"serve", "--default-ttl", "0"}, "--default-ttl 0s: want 10ms to 24h"},
		{nil, []string{"serve", "--default-ttl", "-1s"}, "--default-ttl -1s: want 10ms to 24h"},
		{[]string{"FENCED_MAX_TTL=0"}, []string{"serve"}, "--max-ttl 0s: want 10ms to 24h"},
		{[]string{"FENCED_DEFAULT_TTL=0s"}, []string{"serve"}, "--default-ttl 0s: want 10ms to 24h"},
		{nil, []string{"serve", "--default-ttl", "2h", "--max-ttl", "1h"}, "--default-ttl 2h0m0s is above --max-ttl 1h0m0s"},
		{nil, []string{"serve", "--max-ttl", "1s"}, "--default-ttl 30s is above --max-ttl 1s"},
		{nil, []string{"dev", "--max-wait", "-1s"}, "--max-wait -1s"},
		{nil, []string{"completion"}, "bash, zsh or fish"},
		{nil, []string{"completion", "tcsh"}, "bash, zsh or fish"},
		{nil, []string{"exec", "bad/name", "--", "true"}, "lock NAME"},
		{nil, []string{"exec", "--ttl", "1ms", "demo", "--", "true"}, "--ttl"},
		{nil, []string{"exec", "--url", "127.0.0.1:7070", "demo", "--", "true"}, "--url"},
		{nil, []string{"exec", "--url", "http://a:1,ftp://b", "demo"}, "--url"},
		{nil, []string{"admin"}, "raise-floor"},
		{nil, []string{"admin", "lower-floor"}, "lower-floor"},
		{nil, []string{"admin", "raise-floor"}, "--etcd-endpoints"},
		{nil, []string{"admin", "raise-floor", "--etcd-endpoints", "http://127.0.0.1:1", "--min-token", "-5"}, "--min-token"},
		{nil, []string{"admin", "floor", "--etcd-endpoints", "http://127.0.0.1:1", "--min-token", "5"}, "--min-token"},
	}
	for _, c := range cases {
		code, _, stderr := run(t, c.env, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s (env %v): exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), c.env, code, stderr, c.want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"help"}, {"dev", "--help"}, {"serve", "-h"}, {"exec", "--help"},
		{"admin", "raise-floor", "--help"}, {"admin", "floor", "--help"}, {"help", "serve"}} {
		code, out, stderr := run(t, nil, args...)
		if code != 0 || !strings.Contains(out, "Usage") {
			t.Errorf("fenced %s: exit %d, stdout %q, stderr %q; want the usage and 0", strings.Join(args, " "), code, out, stderr)
		}
	}
	_, out, _ := run(t, nil, "serve", "--help")
	for _, want := range []string{"--lease-store", "$FENCED_LEASE_STORE", "--redis-sentinel-addrs", "--etcd-initial-cluster", "--max-ttl", "(default redis)"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
	code, out, _ := run(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "fenced ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}

// A port taken by another process names the flag that chose it and what to
// do, as --listen's does; the embedded member's said only "bind: address
// already in use".
func TestTakenPortNamesItsFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, args := range [][]string{
		{"dev", "--listen", ln.Addr().String()},
		{"dev", "--listen", "127.0.0.1:0", "--etcd-client-url", "http://" + ln.Addr().String()},
	} {
		code, _, stderr := run(t, nil, args...)
		if code == 0 || !strings.Contains(stderr, "the address is in use") || !strings.Contains(stderr, args[len(args)-2]) {
			t.Errorf("fenced %s with the port taken: exit %d, stderr %q; want the flag named and what to do", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestPortOutOfRange: a port past 65535 in an etcd URL is refused when the
// flags are parsed, naming the flag and the range, as --listen's is. url.Parse
// accepts it: an embedded member failed to start with "address 99999:
// invalid port" and no flag named, and an external endpoint was waited for
// for ever.
func TestPortOutOfRange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	member := []string{"serve", "--lease-store", "etcd", "--etcd-data-dir", dir}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"dev", "--etcd-client-url", "http://127.0.0.1:99999"}, `--etcd-client-url "http://127.0.0.1:99999": port "99999": want a number from 1 to 65535`},
		{append(member, "--etcd-client-url", "http://127.0.0.1:0"), `--etcd-client-url "http://127.0.0.1:0": port "0": want a number from 1 to 65535`},
		{append(member, "--etcd-peer-url", "http://127.0.0.1:70000"), `--etcd-peer-url "http://127.0.0.1:70000": port "70000": want a number from 1 to 65535`},
		{append(member, "--etcd-name", "a", "--etcd-peer-url", "http://127.0.0.1:1",
			"--etcd-initial-cluster", "a=http://127.0.0.1:1,b=http://127.0.0.1:99999"), `member b: port "99999": want a number from 1 to 65535`},
		{[]string{"serve", "--lease-store", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379,http://127.0.0.1:99999"}, `--etcd-endpoints: endpoint "http://127.0.0.1:99999": port "99999": want a number from 1 to 65535`},
		{[]string{"admin", "floor", "--etcd-endpoints", "127.0.0.1:99999"}, `endpoint "127.0.0.1:99999": port "99999": want a number from 1 to 65535`},
		{[]string{"serve", "--redis-addr", "127.0.0.1:99999"}, `--redis-addr: address "127.0.0.1:99999": port "99999": want a number from 1 to 65535`},
		{[]string{"dev", "--redis-addr", "127.0.0.1:0"}, `--redis-addr: address "127.0.0.1:0": port "0": want a number from 1 to 65535`},
		{[]string{"serve", "--redis-cluster-addrs", "a:7000,b:70000"}, `--redis-cluster-addrs: address "b:70000": port "70000"`},
		{[]string{"exec", "--url", "http://127.0.0.1:99999", "demo", "--", "true"}, `--url: client: URL "http://127.0.0.1:99999": port "99999": want a number from 1 to 65535`},
	}
	for _, c := range cases {
		code, _, stderr := run(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
	}
}

// TestEveryCommandNamesTheVariable: every command that reads its flags from
// the environment (the commands fenced completion lists) says which
// variable set a flag its usage error names. fenced locks and the pg-*
// commands said only "--limit", "--timeout".
func TestEveryCommandNamesTheVariable(t *testing.T) {
	t.Parallel()
	etcd := []string{"--etcd-endpoints", "http://127.0.0.1:1"}
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"FENCED_LISTEN=localhost"}, []string{"dev"}, "--listen is set by $FENCED_LISTEN"},
		{[]string{"FENCED_MAX_TTL=1ms"}, []string{"serve"}, "--max-ttl is set by $FENCED_MAX_TTL"},
		{[]string{"FENCED_TTL=1ms"}, []string{"exec", "demo"}, "--ttl is set by $FENCED_TTL"},
		{[]string{"FENCED_TTL=1ms"}, []string{"elect", "demo"}, "--ttl is set by $FENCED_TTL"},
		{[]string{"FENCED_LIMIT=-1"}, []string{"locks", "list"}, "--limit -1: want >= 0 (0: all); --limit is set by $FENCED_LIMIT"},
		{[]string{"FENCED_CLIENT_TOKEN=x", "FENCED_CLIENT_TOKEN_FILE=/nonexistent"}, []string{"locks", "get", "demo"},
			"--client-token is set by $FENCED_CLIENT_TOKEN, --client-token-file is set by $FENCED_CLIENT_TOKEN_FILE"},
		{[]string{"FENCED_MAX_REQUEST_WAIT=0s"}, []string{"locks", "release", "demo"}, "--max-request-wait is set by $FENCED_MAX_REQUEST_WAIT"},
		{[]string{"FENCED_TIMEOUT=0s"}, append([]string{"admin", "raise-floor"}, etcd...), "--timeout is set by $FENCED_TIMEOUT"},
		{[]string{"FENCED_TIMEOUT=0s"}, append([]string{"admin", "floor"}, etcd...), "--timeout is set by $FENCED_TIMEOUT"},
		{[]string{"FENCED_TABLE=" + strings.Repeat("t", 64)}, []string{"admin", "pg-sql"}, "--table is set by $FENCED_TABLE"}, // an empty one is unset (defect 139)
		{[]string{"FENCED_TIMEOUT=0s", "FENCED_DATABASE_URL=postgres://127.0.0.1:1/db"}, []string{"admin", "pg-migrate"}, "--timeout 0s: want > 0; --timeout is set by $FENCED_TIMEOUT"},
	}
	for _, c := range cases {
		code, _, stderr := run(t, c.env, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s (env %v): exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), c.env, code, stderr, c.want)
		}
	}
}
