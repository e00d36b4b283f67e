package testenv

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
)

// A redis-server whose port another redis-server took before it bound it
// is started again on a fresh port. Before, the other server's answer to
// PING passed for its own, and the test used a stranger's Redis.
func TestStartRedisWhenItsPortIsTaken(t *testing.T) {
	other := StartRedis(t)
	real, given := freePort, false
	freePort = func(t testing.TB) int {
		if !given {
			given = true
			return other.Port()
		}
		return real(t)
	}
	defer func() { freePort = real }()
	r := StartRedis(t)
	if r.Port() == other.Port() {
		t.Fatalf("the server is on the taken port %d", r.Port())
	}
	info, err := r.Client().Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("process_id:%d", r.cmd.Process.Pid); !strings.Contains(info, want) {
		t.Fatalf("the server's address answers as another process: want %s in INFO", want)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := r.Client().Ping(t.Context()).Err(); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}

// A Redis Cluster node whose bus port (its port + 10000) another process
// holds exits at start with "bind: Address already in use"; the start is
// tried again on a fresh port. Before, the capital A failed the check, and
// TestRedisCluster with it (CI).
func TestStartClusterNodeWhenItsBusPortIsTaken(t *testing.T) {
	real, given := freePort, false
	var taken int
	freePort = func(t testing.TB) int {
		for !given {
			p := real(t)
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
			if err != nil {
				continue // that bus port is in use already: another
			}
			t.Cleanup(func() { ln.Close() })
			given, taken = true, p
		}
		if taken != 0 {
			p := taken
			taken = 0
			return p
		}
		return real(t)
	}
	defer func() { freePort = real }()
	r := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	if err := r.Client().Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
}
