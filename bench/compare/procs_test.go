package compare

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// takenFirst makes freePort return port once, then free ports again: the
// port is taken between freePort's check and the child's bind, as another
// program on the machine did in a CI run (etcd: "bind: address already in
// use").
func takenFirst(t *testing.T, port int) {
	t.Helper()
	real, given := freePort, false
	freePort = func() (int, error) {
		if !given {
			given = true
			return port, nil
		}
		return real()
	}
	t.Cleanup(func() { freePort = real })
}

// A redis-server whose port another redis-server took is started again on
// a fresh port; before, the other server's answer to PING passed for its
// own and the node pointed at a stranger.
func TestRedisStartsAgainWhenItsPortIsTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other, err := startRedis(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer other.p.kill()
	takenFirst(t, other.port)
	r, err := startRedis(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.p.kill()
	if r.port == other.port {
		t.Fatalf("the node is on the taken port %d", r.port)
	}
	c := r.client()
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("process_id:%d", r.p.cmd.Process.Pid); !strings.Contains(info, want) {
		t.Fatalf("the node's address answers as another process: want %s in INFO", want)
	}
}

// An etcd cluster one of whose ports was taken starts again on fresh ports.
func TestEtcdStartsAgainWhenAPortIsTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	takenFirst(t, taken)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	members, err := startEtcd(ctx, exe, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer members[0].p.kill()
	if strings.HasSuffix(members[0].ClientURL(), fmt.Sprint(":", taken)) {
		t.Fatalf("the member's client URL %s is the taken port", members[0].ClientURL())
	}
	cli, err := etcdClient(members...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("the restarted member does not serve: %v", err)
	}
}
