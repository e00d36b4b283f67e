package testenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisProc is a redis-server process of the test's own, on a free port,
// killed in t.Cleanup. Tests use it for what the machine's Redis cannot
// show: restarts, pauses, replicas, clusters.
type RedisProc struct {
	Addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	t    testing.TB
}

// StartRedis starts redis-server with no persistence and extra args.
func StartRedis(t testing.TB, extra ...string) *RedisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &RedisProc{Addr: fmt.Sprintf("127.0.0.1:%d", port), port: port, dir: t.TempDir(), t: t}
	r.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", r.dir}, extra...)
	r.start()
	t.Cleanup(func() { r.Kill() })
	return r
}

func (r *RedisProc) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", r.args...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			r.t.Fatalf("redis-server on %s did not answer in 10s", r.Addr)
		}
		time.Sleep(5 * time.Millisecond) // polling a process that is starting
	}
}

// Port is the TCP port.
func (r *RedisProc) Port() int { return r.port }

// Client returns a client of this server, closed in t.Cleanup.
func (r *RedisProc) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// Stop freezes the process with SIGSTOP; Cont resumes it.
func (r *RedisProc) Stop() { r.signal(syscall.SIGSTOP) }

// Cont resumes a stopped process.
func (r *RedisProc) Cont() { r.signal(syscall.SIGCONT) }

func (r *RedisProc) signal(s syscall.Signal) {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(s)
	}
}

// Kill kills the process and waits for it. It is idempotent.
func (r *RedisProc) Kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a stopped process must run to die promptly
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Restart kills the process and starts it again on the same port: with no
// persistence it comes back empty.
func (r *RedisProc) Restart() {
	r.Kill()
	r.start()
}

// StartRedisCluster starts n masters in cluster mode and joins them into one
// cluster with the slots spread over them.
func StartRedisCluster(t testing.TB, n int) []*RedisProc {
	t.Helper()
	nodes := make([]*RedisProc, n)
	addrs := make([]string, n)
	for i := range nodes {
		nodes[i] = StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		addrs[i] = nodes[i].Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, nd := range nodes {
		c := nd.Client()
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s: %v %s", nd.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling cluster formation
		}
	}
	return nodes
}

// StartRedisConf starts redis-server with a config file (Sentinel needs
// one it can rewrite) and extra args.
func StartRedisConf(t testing.TB, conf string, extra ...string) *RedisProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &RedisProc{Addr: fmt.Sprintf("127.0.0.1:%d", port), port: port, dir: t.TempDir(), t: t}
	r.args = append([]string{conf, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", r.dir}, extra...)
	r.start()
	t.Cleanup(func() { r.Kill() })
	return r
}
