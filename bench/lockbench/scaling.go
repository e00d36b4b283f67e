package lockbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"
	"github.com/fenced/fenced/internal/clock"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// How cost grows: throughput, p99 and CPU against concurrent clients on
// distinct names, and CPU and memory against locks held at once, each
// kept alive, for etcd's Mutex and fenced's two stores.

// ScalingConfig says what the scaling run sweeps.
type ScalingConfig struct {
	RedisAddr string
	NoFsync   bool
	// Clients are the client counts of the first sweep, each on its own
	// lock name, acquiring and releasing for Window each.
	Clients []int
	Window  time.Duration
	// Held are the counts of locks held at once in the second sweep, each
	// kept alive with HeldTTL, measured over HeldWindow (one keep-alive
	// period, HeldTTL/3, or more).
	Held       []int
	HeldTTL    time.Duration
	HeldWindow time.Duration
	// Only, if not empty, runs only the implementations named.
	Only     []string
	Progress io.Writer
}

// DefaultScalingConfig is the full scaling run.
func DefaultScalingConfig() ScalingConfig {
	return ScalingConfig{
		RedisAddr:  "127.0.0.1:6379",
		Clients:    []int{1, 8, 64, 256, 1024},
		Window:     2 * time.Second,
		Held:       []int{10, 100, 1000, 10000, 100000},
		HeldTTL:    30 * time.Second,
		HeldWindow: 10 * time.Second,
	}
}

// ScalingImpls are the implementations the scaling run compares.
var ScalingImpls = []string{EtcdMutex, FencedRedis, FencedEtcd}

// ClientPoint is one implementation at one client count.
type ClientPoint struct {
	Impl     string
	Clients  int
	Ops      int
	Elapsed  time.Duration
	P50, P99 time.Duration
	CPU      time.Duration // this process (clients and the embedded etcd) plus Redis, over the window
	Errors   int
	FirstErr error
}

// OpsPerSec is the throughput.
func (p ClientPoint) OpsPerSec() float64 { return perSec(p.Ops, p.Elapsed) }

// CPUPerOp is the CPU of one acquire+release pair.
func (p ClientPoint) CPUPerOp() time.Duration { return perOp(p.CPU, p.Ops) }

// HeldPoint is one implementation holding Held locks at once.
type HeldPoint struct {
	Impl string
	Held int
	// Acquire is how long taking them all took (64 at a time).
	Acquire time.Duration
	// CPU over the window, while nothing but keep-alive ran: this process
	// (clients and the embedded etcd) plus Redis.
	CPU    time.Duration
	Window time.Duration
	Idle   time.Duration // CPU per second with nothing held, measured before the sweep
	// Memory the held locks added: the Go heap and stacks of this process
	// (clients and embedded etcd, after a GC), Redis's used_memory, and
	// etcd's database in use.
	ProcBytes, RedisBytes, EtcdBytes int64
	// Allocs is how many heap allocations this process made over the
	// window: the garbage keeping the locks makes, which its CPU includes
	// the collection of.
	Allocs   uint64
	Errors   int
	FirstErr error
}

// CPUPerSec is the CPU per second of keeping the locks, above idle
// (the embedded etcd and the runtime use some with nothing held).
func (p HeldPoint) CPUPerSec() time.Duration {
	if p.Window <= 0 {
		return 0
	}
	return max(time.Duration(float64(p.CPU)/p.Window.Seconds())-p.Idle, 0)
}

// CPUPerLockSec is the CPU that keeping one lock held costs per second,
// above idle.
func (p HeldPoint) CPUPerLockSec() time.Duration {
	return p.CPUPerSec() / time.Duration(max(p.Held, 1))
}

// AllocsPerLockSec is the heap allocations a held lock costs a second.
func (p HeldPoint) AllocsPerLockSec() float64 {
	if p.Window <= 0 {
		return 0
	}
	return float64(p.Allocs) / p.Window.Seconds() / float64(max(p.Held, 1))
}

// BytesPerLock is the memory per held lock, in process, Redis and etcd; 0
// where the reading fell (other allocations freed meanwhile: at a few
// locks, the figures are noise).
func (p HeldPoint) BytesPerLock() (proc, redis, etcd float64) {
	n := float64(max(p.Held, 1))
	return float64(max(p.ProcBytes, 0)) / n, float64(max(p.RedisBytes, 0)) / n, float64(max(p.EtcdBytes, 0)) / n
}

// ScalingReport is a scaling run's figures.
type ScalingReport struct {
	Config  ScalingConfig
	Load    string
	Clients []ClientPoint
	Held    []HeldPoint
	// IdleCPU is CPU per second (process and Redis) with nothing held,
	// measured over a held window before the held sweep.
	IdleCPU time.Duration
}

// RunScaling runs both sweeps for every implementation.
func RunScaling(ctx context.Context, cfg ScalingConfig) (*ScalingReport, error) {
	if len(cfg.Clients) == 0 && len(cfg.Held) == 0 {
		return nil, errors.New("lockbench: scaling: nothing to sweep")
	}
	if cfg.Window <= 0 || cfg.HeldWindow <= 0 || cfg.HeldTTL < 2*time.Second {
		return nil, errors.New("lockbench: scaling: want windows > 0 and a held TTL >= 2s (etcd)")
	}
	run, err := benchkit.RunID()
	if err != nil {
		return nil, err
	}
	maxClients := slices.Max(append([]int{64}, cfg.Clients...))
	rdb, cli, closeBackends, err := backends(ctx, cfg.RedisAddr, maxClients+64, cfg.NoFsync)
	if err != nil {
		return nil, err
	}
	defer closeBackends()
	rep := &ScalingReport{Config: cfg}
	before := benchkit.Loadavg()
	want := func(name string) bool { return len(cfg.Only) == 0 || slices.Contains(cfg.Only, name) }
	rp, ep := "lockbench-scaling:"+run+":", "/lockbench-scaling/"+run+"/"

	for _, n := range cfg.Clients {
		for _, name := range ScalingImpls {
			if !want(name) {
				continue
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "lockbench: scaling: %s, %d clients\n", name, n)
			}
			impl, err := scalingImpl(name, rdb, cli, rp+fmt.Sprintf("c%d-", n), ep+fmt.Sprintf("c%d-", n), DefaultConfig().TTL)
			if err != nil {
				return nil, err
			}
			p, err := clientSweep(ctx, rdb, impl, n, cfg.Window)
			if cerr := impl.Close(); err == nil && cerr != nil {
				err = cerr
			}
			if err != nil {
				return nil, fmt.Errorf("lockbench: scaling: %s, %d clients: %w", name, n, err)
			}
			rep.Clients = append(rep.Clients, p)
		}
	}
	if len(cfg.Held) > 0 {
		m := startCPU(ctx, rdb)
		start := time.Now()
		if !clock.Sleep(ctx, cfg.HeldWindow) {
			return nil, ctx.Err()
		}
		rep.IdleCPU = time.Duration(float64(m.since(ctx)) / time.Since(start).Seconds())
	}
	for _, h := range cfg.Held {
		for _, name := range ScalingImpls {
			if !want(name) {
				continue
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "lockbench: scaling: %s, %d locks held\n", name, h)
			}
			impl, err := scalingImpl(name, rdb, cli, rp+fmt.Sprintf("h%d-", h), ep+fmt.Sprintf("h%d-", h), cfg.HeldTTL)
			if err != nil {
				return nil, err
			}
			p, err := heldSweep(ctx, cfg, rdb, cli, impl, h)
			if cerr := impl.Close(); err == nil && cerr != nil {
				err = cerr
			}
			p.Idle = rep.IdleCPU
			if err != nil {
				return nil, fmt.Errorf("lockbench: scaling: %s, %d held: %w", name, h, err)
			}
			rep.Held = append(rep.Held, p)
		}
	}
	rep.Load = before + " before, " + benchkit.Loadavg() + " after"
	return rep, nil
}

// clientSweep: n clients, each with its own locker on its own name,
// acquire and release for window, after a warm-up of a quarter of it
// (new sessions, connections and etcd's caches).
func clientSweep(ctx context.Context, rdb *redis.Client, impl Impl, n int, window time.Duration) (ClientPoint, error) {
	p := ClientPoint{Impl: impl.Name, Clients: n}
	ls, err := newLockers(ctx, impl, n)
	if err != nil {
		return p, err
	}
	defer closeLockers(ls)
	var e benchkit.Errs
	phase := func(d time.Duration) [][]time.Duration {
		var (
			stop atomic.Bool
			wg   sync.WaitGroup
			lats = make([][]time.Duration, n)
		)
		timer := time.AfterFunc(d, func() { stop.Store(true) })
		defer timer.Stop()
		for i, l := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := "scaling-" + strconv.Itoa(i)
				for !stop.Load() && ctx.Err() == nil && !e.TooMany() {
					t := time.Now()
					if err := lockUnlock(ctx, l, name); err != nil {
						e.Add(err)
						continue
					}
					lats[i] = append(lats[i], time.Since(t))
				}
			}()
		}
		wg.Wait()
		return lats
	}
	phase(window / 4)
	m := startCPU(ctx, rdb)
	start := time.Now()
	lats := phase(window)
	p.Elapsed = time.Since(start)
	p.CPU = m.since(ctx)
	all := slices.Concat(lats...)
	p.Ops = len(all)
	p.P50, p.P99 = benchkit.Percentile(all, 50), benchkit.Percentile(all, 99)
	p.Errors, p.FirstErr = e.Result()
	return p, ctx.Err()
}

// scalingImpl is one of ScalingImpls, its keys under rp (Redis) and ep
// (etcd), with leases of ttl.
func scalingImpl(name string, rdb *redis.Client, cli *clientv3.Client, rp, ep string, ttl time.Duration) (Impl, error) {
	switch name {
	case EtcdMutex:
		return newEtcdMutex(cli, ep+"mutex/", ttl), nil
	case FencedRedis:
		return newFencedRedis(rdb, cli, rp+"fenced:", ep+"fenced-redis/", ttl, "", false)
	case FencedEtcd:
		return newFencedEtcd(cli, ep+"fenced-etcd/", ttl, "", false)
	}
	return Impl{}, fmt.Errorf("no implementation %q", name)
}

// heldSweep holds h locks of impl, each kept alive, and measures the CPU
// of keeping them over the window and the memory they take.
func heldSweep(ctx context.Context, cfg ScalingConfig, rdb *redis.Client, cli *clientv3.Client, impl Impl, h int) (HeldPoint, error) {
	p := HeldPoint{Impl: impl.Name, Held: h, Window: cfg.HeldWindow}
	proc0, redis0, etcd0 := procBytes(), redisBytes(ctx, rdb), etcdBytes(ctx, cli)
	var e benchkit.Errs
	releases := make([]func(context.Context) error, h)
	start := time.Now()
	inParallel(h, func(i int) {
		if ctx.Err() != nil || e.TooMany() {
			return
		}
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		var err error
		if releases[i], err = impl.Hold(octx, "held-"+strconv.Itoa(i)); err != nil {
			e.Add(err)
		}
	})
	p.Acquire = time.Since(start)
	m, a := startCPU(ctx, rdb), mallocs()
	clock.Sleep(ctx, cfg.HeldWindow) // a cancelled run is reported below
	p.CPU, p.Allocs = m.since(ctx), mallocs()-a
	p.ProcBytes, p.RedisBytes, p.EtcdBytes = procBytes()-proc0, redisBytes(ctx, rdb)-redis0, etcdBytes(ctx, cli)-etcd0
	p.Errors, p.FirstErr = e.Result()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	inParallel(h, func(i int) {
		if releases[i] != nil {
			_ = releases[i](rctx) // a lease lost meanwhile is released already
		}
	})
	return p, ctx.Err()
}

// inParallel calls f(0) to f(n-1), 64 at a time.
func inParallel(n int, f func(i int)) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(n, 64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				f(int(i))
			}
		}()
	}
	wg.Wait()
}

// cpuMeter reads the CPU of this process and of the Redis server.
type cpuMeter struct {
	rdb        *redis.Client
	proc, rdis time.Duration
}

func startCPU(ctx context.Context, rdb *redis.Client) cpuMeter {
	return cpuMeter{rdb: rdb, proc: benchkit.ProcessCPU(), rdis: redisCPU(ctx, rdb)}
}

// since is the CPU used since the meter started: this process's, plus
// Redis's when Redis says.
func (m cpuMeter) since(ctx context.Context) time.Duration {
	d := benchkit.ProcessCPU() - m.proc
	if m.rdis >= 0 {
		if r := redisCPU(ctx, m.rdb); r >= 0 {
			d += r - m.rdis
		}
	}
	return d
}

// mallocs is how many heap objects this process has allocated.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// procBytes is this process's Go heap and stacks in use, after a GC.
func procBytes() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// redisBytes is Redis's used_memory.
func redisBytes(ctx context.Context, rdb *redis.Client) int64 {
	m, err := rdb.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(m["Memory"]["used_memory"], 10, 64)
	return n
}

// etcdBytes is the embedded etcd's database in use.
func etcdBytes(ctx context.Context, cli *clientv3.Client) int64 {
	eps := cli.Endpoints()
	if len(eps) == 0 {
		return 0
	}
	st, err := cli.Status(ctx, eps[0])
	if err != nil {
		return 0
	}
	return st.DbSizeInUse
}
