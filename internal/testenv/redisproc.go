package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fenced/fenced/internal/freeport"
)

// RedisProc is a redis-server process of the test's own, on a free port,
// killed in t.Cleanup. Tests use it for what the machine's Redis cannot
// show: restarts, pauses, replicas, clusters.
type RedisProc struct {
	Addr string
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	out  *SyncBuffer   // the server's log
	t    testing.TB
}

// StartRedis starts redis-server with no persistence and extra args.
func StartRedis(t testing.TB, extra ...string) *RedisProc {
	t.Helper()
	return startRedis(t, nil, append([]string{"--save", "", "--appendonly", "no"}, extra...))
}

// StartRedisConf starts redis-server with a config file (Sentinel needs
// one it can rewrite) and extra args.
func StartRedisConf(t testing.TB, conf string, extra ...string) *RedisProc {
	t.Helper()
	return startRedis(t, []string{conf}, extra)
}

// startRedis starts redis-server on a port free a moment ago, and on a
// fresh one while the port was taken before the server bound it (other
// tests run in parallel processes).
func startRedis(t testing.TB, conf, extra []string) *RedisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	dir := t.TempDir()
	for try := 1; ; try++ {
		port := freePort(t)
		r := &RedisProc{Addr: fmt.Sprintf("127.0.0.1:%d", port), port: port, t: t}
		r.args = append(append(append([]string{}, conf...), "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir), extra...)
		err := r.start()
		if err == nil {
			t.Cleanup(r.Kill)
			return r
		}
		if try == 3 || !portTaken(err) {
			t.Fatal(err)
		}
	}
}

// portTaken reports a start that failed because another process took its
// port between the free-port check and the bind, or a cluster node's bus
// port (its port + 10000), which Redis reports as "bind: Address already
// in use": the case matters not.
func portTaken(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "address already in use")
}

// freePort is a loopback port free a moment ago, never handed out before
// in this process. A variable for tests.
var freePort = func(t testing.TB) int {
	t.Helper()
	p, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start starts the process and waits until it answers. The answer must come
// from this process: another redis-server may have taken the port first.
func (r *RedisProc) start() error {
	r.out = &SyncBuffer{}
	cmd := exec.Command("redis-server", r.args...)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(r.done) }()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rdb.Close()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		select {
		case <-r.done:
			r.cmd = nil
			return fmt.Errorf("redis-server on %s exited at start: %s", r.Addr, strings.TrimSpace(r.out.String()))
		default:
		}
		if time.Now().After(deadline) {
			r.Kill()
			return fmt.Errorf("redis-server on %s did not answer in 10s", r.Addr)
		}
		time.Sleep(5 * time.Millisecond) // polling a process that is starting
	}
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		r.Kill()
		return fmt.Errorf("redis-server on %s: INFO: %w", r.Addr, err)
	}
	if !strings.Contains(info, fmt.Sprintf("\nprocess_id:%d\r", cmd.Process.Pid)) {
		r.Kill()
		return fmt.Errorf("redis-server on %s: another process answers on the port (address already in use)", r.Addr)
	}
	return nil
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
	<-r.done
	r.cmd = nil
}

// Restart kills the process and starts it again on the same port: with no
// persistence it comes back empty. It returns the error, not t.Fatal, so
// that a goroutine other than the test's can restart a server.
func (r *RedisProc) Restart() error {
	r.Kill()
	return r.start()
}

// StartReplica starts a replica of master, as StartRedis does, and
// returns once it follows it.
func StartReplica(t testing.TB, master *RedisProc) *RedisProc {
	t.Helper()
	replica := StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port()))
	rc := replica.Client()
	WaitUntil(t, 30*time.Second, func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	return replica
}

// SentinelMaster is the name StartSentinel watches its master under.
const SentinelMaster = "m"

// StartSentinel starts a Sentinel, the only one, watching master as
// SentinelMaster: it fails over once the master has not answered for
// 300 ms.
func StartSentinel(t testing.TB, master *RedisProc) *RedisProc {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %[1]s 300\nsentinel failover-timeout %[1]s 3000\n", SentinelMaster, master.Port()), 0o644); err != nil {
		t.Fatal(err)
	}
	return StartRedisConf(t, conf, "--sentinel")
}
