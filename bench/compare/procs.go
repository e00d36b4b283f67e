package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced/fenced/internal/freeport"
	"github.com/fenced/fenced/sequencer"
)

// Every process a scenario starts is its own: redis-server processes on
// free ports, etcd members and workers (this program re-executed). Each
// dies with the orchestrator (Pdeathsig) and is killed and waited for when
// the scenario ends.

func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// freePort returns a port that is free now, never one it returned before
// (freeport: a cluster's ports once collided). The child that binds it later
// may find it taken meanwhile by another program, so every start that binds
// ports from freePort goes through withFreePorts. A variable for tests.
var freePort = freeport.Port

// portTries is how many sets of fresh ports a start gets.
const portTries = 3

// withFreePorts calls start, which binds ports it takes from freePort,
// again with fresh ports while its error says a port was taken between
// freePort's check and the child's bind.
func withFreePorts[T any](start func(try int) (T, error)) (T, error) {
	for try := 0; ; try++ {
		v, err := start(try)
		if err == nil || try == portTries-1 || !portTaken(err) {
			return v, err
		}
	}
}

// portTaken reports a bind that failed on a taken port: the children report
// it as text (etcd's error on stderr, redis-server's log).
func portTaken(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "address already in use")
}

// proc is a child process that can be frozen, resumed and killed.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been waited for
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) freeze() error { return p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *proc) thaw() error   { return p.cmd.Process.Signal(syscall.SIGCONT) }

// kill kills the process and waits for it; idempotent.
func (p *proc) kill() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// redisNode is a redis-server without persistence on a port of its own.
type redisNode struct {
	Addr    string
	port    int
	dir     string
	extra   []string
	env     []string
	p       *proc
	faketim string // the libfaketime timestamp file, if any
}

// faketime preloads libfaketime (and glibc's malloc_debug, without which
// jemalloc recurses into clock_gettime at start and Redis aborts), faking
// only the real-time clock, read from a file at every call.
var (
	libfaketime   = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
	libmallocdbg  = "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
	errNoFaketime = errors.New("libfaketime is not installed (apt-get install libfaketime)")
)

func startRedis(ctx context.Context, dir string, faketime bool, extra ...string) (*redisNode, error) {
	return withFreePorts(func(int) (*redisNode, error) { return startRedisOnce(ctx, dir, faketime, extra...) })
}

func startRedisOnce(ctx context.Context, dir string, faketime bool, extra ...string) (*redisNode, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &redisNode{Addr: fmt.Sprintf("127.0.0.1:%d", port), port: port, dir: dir, extra: extra}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if faketime {
		for _, lib := range []string{libfaketime, libmallocdbg} {
			if _, err := os.Stat(lib); err != nil {
				return nil, fmt.Errorf("%w: %v", errNoFaketime, err)
			}
		}
		r.faketim = dir + "/faketime"
		if err := os.WriteFile(r.faketim, []byte("+0\n"), 0o644); err != nil {
			return nil, err
		}
		r.env = []string{"LD_PRELOAD=" + libfaketime + " " + libmallocdbg, "FAKETIME_TIMESTAMP_FILE=" + r.faketim,
			"FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_NO_CACHE=1"}
	}
	return r, r.start(ctx)
}

func (r *redisNode) start(ctx context.Context) error {
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.dir, "--logfile", r.dir + "/redis.log"}, r.extra...)
	cmd := exec.Command("redis-server", args...)
	cmd.Env = append(os.Environ(), r.env...)
	p, err := startProc(cmd)
	if err != nil {
		return fmt.Errorf("start redis-server (apt-get install redis-server): %w", err)
	}
	r.p = p
	c := r.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(ctx).Err() != nil {
		select {
		case <-p.done:
			log, _ := os.ReadFile(r.dir + "/redis.log")
			return fmt.Errorf("redis-server on %s exited at start: %s", r.Addr, lastLines(string(log), 3))
		default:
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("redis-server on %s did not answer in 10s", r.Addr)
		}
		time.Sleep(5 * time.Millisecond) // polling a process that is starting
	}
	// Another redis-server may have taken the port before this one bound
	// it; then the answer came from that one, and this one is exiting.
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		p.kill()
		return fmt.Errorf("redis-server on %s: INFO: %w", r.Addr, err)
	}
	if !strings.Contains(info, fmt.Sprintf("\nprocess_id:%d\r", p.cmd.Process.Pid)) {
		p.kill()
		return fmt.Errorf("redis-server on %s: another process answers on the port (address already in use)", r.Addr)
	}
	return nil
}

func (r *redisNode) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
}

// restart kills the server and starts it again, empty, on the same port.
func (r *redisNode) restart(ctx context.Context) error {
	r.p.kill()
	return r.start(ctx)
}

// jump moves the server's real-time clock by d from the true time.
func (r *redisNode) jump(d time.Duration) error {
	if r.faketim == "" {
		return errors.New("redis-server was not started under libfaketime")
	}
	return os.WriteFile(r.faketim, []byte(fmt.Sprintf("%+ds\n", int(d/time.Second))), 0o644)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// etcdMemberConfig is an etcd member child's configuration (envEtcd).
type etcdMemberConfig struct {
	sequencer.EmbedConfig
}

// runEtcdMember is the etcd role: start the member, say "ready", and run
// until stdin closes.
func runEtcdMember(ctx context.Context, c etcdMemberConfig, stdin io.Reader, stdout io.Writer) error {
	e, err := sequencer.StartEmbedded(ctx, c.EmbedConfig)
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintln(stdout, "ready")
	_, _ = io.Copy(io.Discard, stdin)
	return nil
}

// etcdMember is an etcd member in a child process, so that it can be
// killed and frozen like a real one.
type etcdMember struct {
	cfg   etcdMemberConfig
	p     *proc
	stdin io.WriteCloser // held open: the member runs until it is killed
}

func (m *etcdMember) ClientURL() string { return m.cfg.ClientURL }
func (m *etcdMember) addr() string      { return strings.TrimPrefix(m.cfg.ClientURL, "http://") }

func (m *etcdMember) start(ctx context.Context, exe string) error {
	b, err := json.Marshal(m.cfg)
	if err != nil {
		return err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envEtcd+"="+string(b))
	cmd.Stderr = &logTail{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	p, err := startProc(cmd)
	if err != nil {
		return err
	}
	m.p, m.stdin = p, stdin
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := sc.Scan() && sc.Text() == "ready"
		ready <- ok
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case ok := <-ready:
		if !ok {
			<-p.done
			return fmt.Errorf("etcd member %s did not start: %s", m.cfg.Name, cmd.Stderr.(*logTail).String())
		}
		return nil
	case <-ctx.Done():
		p.kill()
		return ctx.Err()
	case <-time.After(60 * time.Second):
		p.kill()
		return fmt.Errorf("etcd member %s did not start in 60s", m.cfg.Name)
	}
}

// startEtcd starts n members of one cluster in child processes. A try
// after a taken port starts a new cluster in a directory of its own.
func startEtcd(ctx context.Context, exe, dir string, n int) ([]*etcdMember, error) {
	return withFreePorts(func(try int) ([]*etcdMember, error) {
		d := dir
		if try > 0 {
			d = fmt.Sprintf("%s/try%d", dir, try)
		}
		return startEtcdOnce(ctx, exe, d, n)
	})
}

func startEtcdOnce(ctx context.Context, exe, dir string, n int) ([]*etcdMember, error) {
	members := make([]*etcdMember, n)
	var initial []string
	for i := range members {
		cp, err := freePort()
		if err != nil {
			return nil, err
		}
		pp, err := freePort()
		if err != nil {
			return nil, err
		}
		members[i] = &etcdMember{cfg: etcdMemberConfig{sequencer.EmbedConfig{
			Dir: fmt.Sprintf("%s/etcd%d", dir, i), Name: fmt.Sprint("m", i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", cp), PeerURL: fmt.Sprintf("http://127.0.0.1:%d", pp),
			TickMs: 50, ElectionMs: 500, UnsafeNoFsync: true,
		}}}
		initial = append(initial, members[i].cfg.Name+"="+members[i].cfg.PeerURL)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
		wg.Go(func() { errs[i] = m.start(ctx, exe) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range members {
			if m.p != nil {
				m.p.kill()
			}
		}
		return nil, err
	}
	return members, nil
}

// etcdClient is a client of the given members, for the orchestrator.
func etcdClient(members ...*etcdMember) (*clientv3.Client, error) {
	var eps []string
	for _, m := range members {
		eps = append(eps, m.ClientURL())
	}
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
}

// leader returns the index of the member that leads now, asking each.
func leader(ctx context.Context, members []*etcdMember) (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		for i, m := range members {
			cli, err := etcdClient(m)
			if err != nil {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			st, err := cli.Status(sctx, m.ClientURL())
			cancel()
			cli.Close()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i, nil
			}
		}
		if time.Now().After(deadline) {
			return -1, errors.New("no etcd member leads after 10s")
		}
		time.Sleep(50 * time.Millisecond) // polling an election
	}
}

// logTail keeps the last few KiB a child wrote to stderr.
type logTail struct {
	mu  sync.Mutex
	buf []byte
}

func (l *logTail) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	if len(l.buf) > 8<<10 {
		l.buf = l.buf[len(l.buf)-8<<10:]
	}
	return len(b), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return lastLines(string(l.buf), 5)
}
