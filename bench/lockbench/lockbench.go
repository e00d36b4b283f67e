// Package lockbench compares fenced's locks with the peer libraries people
// use instead, in one process and one run, against the same Redis and the
// same embedded etcd:
//
//   - etcd client/v3/concurrency Mutex (one Session per client),
//   - bsm/redislock (SET NX PX, polled),
//   - go-redsync/redsync with one node,
//   - fenced with leases in Redis and tokens from the etcd sequencer,
//   - fenced with leases in etcd.
//
// Three scenarios: uncontended acquire+release latency (one client, one
// name, sequential), throughput of many clients on distinct names, and one
// hot name shared by a few contenders (handoffs per second and the gap from
// a release to the next holder's acquisition). [Run] measures, [Write]
// prints the table. The peer libraries are imported here only, in the
// nested bench module, never by the main module.
package lockbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"

	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Config says what to run. DefaultConfig and ShortConfig give the usual
// values.
type Config struct {
	RedisAddr  string
	TTL        time.Duration // every implementation's lease TTL
	Iterations int           // uncontended acquire+release pairs (after a warm-up of a tenth)
	Duration   time.Duration // of the throughput and the hot-name scenario each
	Clients    int           // throughput: goroutines, each on its own name
	Contenders int           // hot name: goroutines on one name
	// Rounds: every implementation runs every scenario once per round, in
	// an order that rotates each round; throughput and handoffs are summed
	// over the rounds, latencies pooled. The iterations are split between
	// the rounds; each round runs the throughput and hot-name scenarios for
	// the full Duration.
	Rounds int
	// NoFsync runs the embedded etcd with UnsafeNoFsync. Default false:
	// fsync on, the honest numbers.
	NoFsync bool
	// Only, if not empty, runs only the implementations named (Impl.Name).
	Only []string
	// Inflight, if > 0, adds a row of fenced/redis whose sequencer has
	// sequencer.WithInflight(Inflight), and one of fenced/etcd with
	// lock.WithEtcdInflight(Inflight); the default rows are always there.
	Inflight int
	// Expirers is how many holders walk away from their locks at once in
	// the expiry scenario, each with a waiter (0: no expiry scenario), and
	// ExpiryTTL their TTL (>= 2s: etcd).
	Expirers  int
	ExpiryTTL time.Duration
	// NoUnfair leaves out the rows of fenced with lock.WithUnfair, which
	// show what fair waiting costs.
	NoUnfair bool
	// Progress, if set, receives a line as each implementation starts a round.
	Progress io.Writer
}

// DefaultConfig is the full benchmark.
func DefaultConfig() Config {
	return Config{
		RedisAddr:  "127.0.0.1:6379",
		TTL:        5 * time.Second,
		Iterations: 2000,
		Duration:   3 * time.Second,
		Clients:    64,
		Contenders: 8,
		Rounds:     3,
		Expirers:   8,
		ExpiryTTL:  2 * time.Second,
	}
}

// ShortConfig is a quick run: the same scenarios, much shorter.
func ShortConfig() Config {
	c := DefaultConfig()
	c.Iterations = 100
	c.Duration = 500 * time.Millisecond
	c.Rounds = 1
	return c
}

func (c Config) validate() error {
	switch {
	case c.TTL < 2*time.Second:
		return fmt.Errorf("lockbench: ttl %s: want >= 2s (etcd leases)", c.TTL)
	case c.Iterations < 1 || c.Duration <= 0 || c.Clients < 1 || c.Contenders < 2 || c.Rounds < 1:
		return errors.New("lockbench: want iterations >= 1, duration > 0, clients >= 1, contenders >= 2, rounds >= 1")
	case c.Expirers < 0 || c.Expirers > 0 && c.ExpiryTTL < 2*time.Second:
		return fmt.Errorf("lockbench: expirers %d, expiry ttl %s: want expirers >= 0 and a ttl >= 2s (etcd leases)", c.Expirers, c.ExpiryTTL)
	case c.Inflight < 0 || c.Inflight > 64:
		return fmt.Errorf("lockbench: inflight %d: want 0 (off) to 64", c.Inflight)
	}
	return nil
}

// Result is what one implementation did in the three scenarios.
type Result struct {
	Impl, Wait string

	// Uncontended: one client, one name, sequential acquire+release.
	Uncontended    int // pairs measured
	UncP50, UncP99 time.Duration
	// PutP50 is the p50 of an etcd Put made after each uncontended pair,
	// on the same etcd: the floor under the same conditions as the pairs
	// (a baseline taken minutes apart moves by ±30% on a shared machine).
	PutP50 time.Duration
	// Throughput: Clients goroutines on distinct names.
	Ops          int
	OpsElapsed   time.Duration
	RoundOpsRate []float64 // ops/s of each round
	// CPU time used in the throughput scenario: by this process (the
	// clients and the embedded etcd) and by the Redis server (all its
	// clients, so other users of that Redis count too).
	ProcCPU, RedisCPU time.Duration
	// Hot name: Contenders goroutines on one name.
	Acquisitions   int // on the hot name
	ToOther        int // acquisitions by another contender than the last holder
	HotElapsed     time.Duration
	Gaps           int
	GapP50, GapP99 time.Duration
	// Waits: from a contender's Lock call to its return, every acquisition
	// of the hot name. Their spread is what fairness is about.
	Waits                     int
	WaitP50, WaitP99, WaitMax time.Duration
	MaxHolders                int64 // most holders of the hot name at once: 1 unless exclusion broke

	Errors   int   // failed operations in all scenarios
	FirstErr error // the first of them
	// Expiry: from an abandoned lock's TTL running out to a waiter's Lock
	// returning.
	Handovers                int
	HandoverP50, HandoverP99 time.Duration
	// etcd transactions and what they carried (BatchItems: tokens, or
	// lock operations) in the throughput scenario, where the
	// implementation has group commit (Impl.Batches).
	Txns, Batched uint64
	BatchItems    string
	// RaftWrites is how far etcd's Raft index moved in the throughput
	// scenario: every consensus write (a Txn, a Put, a lease grant or
	// revoke), whoever made it.
	RaftWrites uint64

	unc, puts, gaps, waits, handovers []time.Duration // samples of every round
}

// ProcCPUPerOp and RedisCPUPerOp are the throughput scenario's CPU time per
// acquire+release: a figure that other load on the machine skews far less
// than ops/s, and that bounds ops/s when the CPUs are the bottleneck.
func (r Result) ProcCPUPerOp() time.Duration  { return perOp(r.ProcCPU, r.Ops) }
func (r Result) RedisCPUPerOp() time.Duration { return perOp(r.RedisCPU, r.Ops) }

func perOp(d time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// OpsPerSec is the throughput scenario's acquire+release pairs per second.
func (r Result) OpsPerSec() float64 { return perSec(r.Ops, r.OpsElapsed) }

// HandoffsPerSec is the hot name's acquisitions per second.
func (r Result) HandoffsPerSec() float64 { return perSec(r.Acquisitions, r.HotElapsed) }

// RaftWritesPerOp is the throughput scenario's Raft writes per
// acquire+release, amortised.
func (r Result) RaftWritesPerOp() float64 {
	if r.Ops == 0 {
		return 0
	}
	return float64(r.RaftWrites) / float64(r.Ops)
}

func perSec(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Report is a whole run.
type Report struct {
	Config  Config
	Redis   string // Redis version and persistence
	Load    string // the machine's load averages before and after, from /proc/loadavg
	Results []Result
	// Baselines: one client, sequential.
	EtcdPutP50, EtcdPutP99 time.Duration // an etcd Put: one Raft commit
	RedisP50, RedisP99     time.Duration // a Redis PING
}

// Run sets up Redis and an embedded etcd and measures every implementation
// in turn.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	run, err := benchkit.RunID()
	if err != nil {
		return nil, err
	}
	rdb, cli, closeBackends, err := backends(ctx, cfg.RedisAddr, cfg.Clients+cfg.Contenders+16, cfg.NoFsync)
	if err != nil {
		return nil, err
	}
	defer closeBackends()

	rep := &Report{Config: cfg, Redis: redisInfo(ctx, rdb)}
	loadBefore := benchkit.Loadavg()
	if err := rep.baselines(ctx, rdb, cli, run); err != nil {
		return nil, err
	}
	rp := "lockbench:" + run + ":"
	ep := "/lockbench/" + run + "/"
	type mk func() (Impl, error)
	makers := []mk{
		func() (Impl, error) { return newEtcdMutex(cli, ep+"mutex/", cfg.TTL), nil },
		func() (Impl, error) { return newRedislock(rdb, rp+"redislock:", cfg.TTL), nil },
		func() (Impl, error) { return newRedsync(rdb, rp+"redsync:", cfg.TTL), nil },
		func() (Impl, error) {
			return newFencedRedis(rdb, cli, rp+"fenced:", ep+"fenced-redis/", cfg.TTL, "", false)
		},
	}
	if !cfg.NoUnfair {
		makers = append(makers, func() (Impl, error) {
			return newFencedRedis(rdb, cli, rp+"fenced-unfair:", ep+"fenced-redis-unfair/", cfg.TTL, "", true)
		})
	}
	if cfg.Inflight > 0 {
		makers = append(makers, func() (Impl, error) {
			return newFencedRedis(rdb, cli, rp+"fenced-inflight:", ep+"fenced-redis-inflight/", cfg.TTL,
				fmt.Sprintf("(inflight %d)", cfg.Inflight), false, sequencer.WithInflight(cfg.Inflight))
		})
	}
	makers = append(makers, func() (Impl, error) { return newFencedEtcd(cli, ep+"fenced-etcd/", cfg.TTL, "", false) })
	if !cfg.NoUnfair {
		makers = append(makers, func() (Impl, error) { return newFencedEtcd(cli, ep+"fenced-etcd-unfair/", cfg.TTL, "", true) })
	}
	if cfg.Inflight > 0 {
		makers = append(makers, func() (Impl, error) {
			return newFencedEtcd(cli, ep+"fenced-etcd-inflight/", cfg.TTL, fmt.Sprintf("(inflight %d)", cfg.Inflight), false,
				lock.WithEtcdInflight(cfg.Inflight))
		})
	}

	var impls []Impl
	defer func() {
		for _, impl := range impls {
			impl.Close() // only on an early return; the normal path closed them
		}
	}()
	for _, m := range makers {
		impl, err := m()
		if err != nil {
			return nil, err
		}
		if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, impl.Name) {
			impl.Close()
			continue
		}
		impls = append(impls, impl)
	}
	if len(impls) == 0 {
		return nil, fmt.Errorf("lockbench: -only %q names no implementation", cfg.Only)
	}
	res := make([]Result, len(impls))
	counts := make([]benchkit.Errs, len(impls))
	for i, impl := range impls {
		res[i] = Result{Impl: impl.Name, Wait: impl.Wait}
	}
	// Each round runs every implementation once, starting one further along
	// each time, so that background load and etcd's growing database hit
	// them alike.
	for round := range cfg.Rounds {
		for k := range impls {
			i := (round + k) % len(impls)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "lockbench: round %d/%d: %s\n", round+1, cfg.Rounds, impls[i].Name)
			}
			if err := measure(ctx, cfg, rdb, cli, impls[i], &res[i], &counts[i]); err != nil {
				return nil, fmt.Errorf("lockbench: %s: %w", impls[i].Name, err)
			}
		}
	}
	for i := range impls {
		res[i].Errors, res[i].FirstErr = counts[i].Result()
		res[i].finish()
	}
	var cerr error
	for _, impl := range impls {
		if err := impl.Close(); err != nil {
			cerr = errors.Join(cerr, fmt.Errorf("lockbench: %s: close: %w", impl.Name, err))
		}
	}
	impls = nil
	if cerr != nil {
		return nil, cerr
	}
	rep.Results = res
	rep.Load = loadBefore + " before, " + benchkit.Loadavg() + " after"
	return rep, nil
}

// backends connects to Redis at addr with a pool of pool connections and
// starts an embedded etcd; closeAll stops both.
func backends(ctx context.Context, addr string, pool int, noFsync bool) (rdb *redis.Client, cli *clientv3.Client, closeAll func(), err error) {
	rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool, PoolTimeout: opTimeout, ContextTimeoutEnabled: true})
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		rdb.Close()
		return nil, nil, nil, fmt.Errorf("lockbench: Redis at %s does not answer (%w): start it (redis-server --port 6379) or set FENCED_TEST_REDIS", addr, err)
	}
	etcd, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{UnsafeNoFsync: noFsync})
	if err != nil {
		rdb.Close()
		return nil, nil, nil, fmt.Errorf("lockbench: embedded etcd: %w", err)
	}
	if cli, err = etcd.Client(); err != nil {
		etcd.Close()
		rdb.Close()
		return nil, nil, nil, fmt.Errorf("lockbench: etcd client: %w", err)
	}
	return rdb, cli, func() { cli.Close(); etcd.Close(); rdb.Close() }, nil
}

// redisCPU is the Redis server's used_cpu_user + used_cpu_sys, -1 if
// unknown.
func redisCPU(ctx context.Context, rdb *redis.Client) time.Duration {
	m, err := rdb.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return -1
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(m["CPU"][k], 64)
		if err != nil {
			return -1
		}
		total += v
	}
	return time.Duration(total * float64(time.Second))
}

func redisInfo(ctx context.Context, rdb *redis.Client) string {
	ver := "?"
	if info, err := rdb.InfoMap(ctx, "server").Result(); err == nil {
		if v := info["Server"]["redis_version"]; v != "" {
			ver = v
		}
	}
	aof := "?"
	if m, err := rdb.ConfigGet(ctx, "appendonly").Result(); err == nil {
		aof = m["appendonly"]
	}
	if m, err := rdb.ConfigGet(ctx, "appendfsync").Result(); err == nil && aof == "yes" {
		aof += ", appendfsync " + m["appendfsync"]
	}
	return fmt.Sprintf("Redis %s (appendonly %s)", ver, aof)
}

// baselines measures the floor under every implementation: an etcd write
// (one Raft commit and, with fsync on, one fsync) and a Redis round trip.
func (rep *Report) baselines(ctx context.Context, rdb *redis.Client, cli *clientv3.Client, run string) error {
	n := min(rep.Config.Iterations, 500)
	key := "/lockbench/" + run + "/baseline"
	lat := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if _, err := cli.Put(ctx, key, "x"); err != nil {
			return fmt.Errorf("lockbench: etcd baseline: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	rep.EtcdPutP50, rep.EtcdPutP99 = benchkit.Percentile(lat, 50), benchkit.Percentile(lat, 99)
	lat = lat[:0]
	for range n {
		t := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("lockbench: Redis baseline: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	rep.RedisP50, rep.RedisP99 = benchkit.Percentile(lat, 50), benchkit.Percentile(lat, 99)
	return nil
}

// opTimeout bounds one Lock or unlock call; nothing healthy comes near it.
const opTimeout = 30 * time.Second

// measure runs the three scenarios once and adds to res.
func measure(ctx context.Context, cfg Config, rdb *redis.Client, cli *clientv3.Client, impl Impl, res *Result, e *benchkit.Errs) error {
	n := max(cfg.Iterations/cfg.Rounds, 1)
	if err := uncontended(ctx, n, cli, impl, res, e); err != nil {
		return err
	}
	if err := throughput(ctx, cfg, rdb, cli, impl, res, e); err != nil {
		return err
	}
	if err := hotName(ctx, cfg, impl, res, e); err != nil {
		return err
	}
	return expiry(ctx, cfg, impl, res, e)
}

// finish computes the percentiles of what the rounds collected.
func (r *Result) finish() {
	r.Uncontended = len(r.unc)
	r.UncP50, r.UncP99 = benchkit.Percentile(r.unc, 50), benchkit.Percentile(r.unc, 99)
	r.PutP50 = benchkit.Percentile(r.puts, 50)
	r.Gaps = len(r.gaps)
	r.GapP50, r.GapP99 = benchkit.Percentile(r.gaps, 50), benchkit.Percentile(r.gaps, 99)
	r.Handovers = len(r.handovers)
	r.HandoverP50, r.HandoverP99 = benchkit.Percentile(r.handovers, 50), benchkit.Percentile(r.handovers, 99)
	r.Waits = len(r.waits)
	r.WaitP50, r.WaitP99, r.WaitMax = benchkit.Percentile(r.waits, 50), benchkit.Percentile(r.waits, 99), benchkit.Percentile(r.waits, 100)
}

// newLockers makes n lockers; the caller closes them.
func newLockers(ctx context.Context, impl Impl, n int) ([]Locker, error) {
	ls := make([]Locker, 0, n)
	for range n {
		l, err := impl.NewLocker(ctx)
		if err != nil {
			closeLockers(ls)
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func closeLockers(ls []Locker) {
	for _, l := range ls {
		_ = l.Close() // the benchmark is over for them; an error changes no figure
	}
}

// lockUnlock is one acquire+release pair.
func lockUnlock(ctx context.Context, l Locker, name string) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	unlock, err := l.Lock(octx, name)
	if err != nil {
		return err
	}
	return unlock(octx)
}

// uncontended: one client, one name, Iterations sequential pairs after a
// warm-up of a tenth as many, each followed by an etcd Put, timed apart.
func uncontended(ctx context.Context, n int, cli *clientv3.Client, impl Impl, res *Result, e *benchkit.Errs) error {
	ls, err := newLockers(ctx, impl, 1)
	if err != nil {
		return err
	}
	defer closeLockers(ls)
	warm := max(n/10, 5)
	for i := 0; i < warm+n && !e.TooMany(); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		t := time.Now()
		if err := lockUnlock(ctx, ls[0], "bench-uncontended"); err != nil {
			e.Add(fmt.Errorf("uncontended: %w", err))
			continue
		}
		if i < warm {
			continue
		}
		res.unc = append(res.unc, time.Since(t))
		t = time.Now()
		if _, err := cli.Put(ctx, "/lockbench/uncontended-put", "x"); err != nil {
			return fmt.Errorf("lockbench: etcd Put after a pair: %w", err)
		}
		res.puts = append(res.puts, time.Since(t))
	}
	return nil
}

// throughput: Clients goroutines, each with its own locker on its own name,
// acquire and release for Duration. Ops in flight at the end complete and
// count; the elapsed time runs until the last one has.
func throughput(ctx context.Context, cfg Config, rdb *redis.Client, cli *clientv3.Client, impl Impl, res *Result, e *benchkit.Errs) error {
	ls, err := newLockers(ctx, impl, cfg.Clients)
	if err != nil {
		return err
	}
	defer closeLockers(ls)
	var (
		stop atomic.Bool
		ops  atomic.Int64
		wg   sync.WaitGroup
	)
	var txns0, toks0 uint64
	if impl.Batches != nil {
		txns0, toks0 = impl.Batches()
	}
	raft0, err := raftIndex(ctx, cli)
	if err != nil {
		return err
	}
	cpu0, rcpu0 := benchkit.ProcessCPU(), redisCPU(ctx, rdb)
	start := time.Now()
	timer := time.AfterFunc(cfg.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("bench-throughput-%d", i)
			for !stop.Load() && ctx.Err() == nil && !e.TooMany() {
				if err := lockUnlock(ctx, l, name); err != nil {
					e.Add(fmt.Errorf("throughput: %w", err))
					continue
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	res.ProcCPU += benchkit.ProcessCPU() - cpu0
	raft1, err := raftIndex(ctx, cli)
	if err != nil {
		return err
	}
	res.RaftWrites += raft1 - raft0
	if impl.Batches != nil {
		txns1, toks1 := impl.Batches()
		res.Txns += txns1 - txns0
		res.Batched += toks1 - toks0
		res.BatchItems = impl.BatchItems
	}
	if rcpu0 >= 0 {
		if rcpu1 := redisCPU(ctx, rdb); rcpu1 >= 0 {
			res.RedisCPU += rcpu1 - rcpu0
		}
	}
	res.Ops += int(ops.Load())
	res.OpsElapsed += elapsed
	res.RoundOpsRate = append(res.RoundOpsRate, perSec(int(ops.Load()), elapsed))
	return ctx.Err()
}

// raftIndex is the embedded etcd's Raft index: it moves by one for every
// entry consensus commits.
func raftIndex(ctx context.Context, cli *clientv3.Client) (uint64, error) {
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		return 0, fmt.Errorf("lockbench: etcd status: %w", err)
	}
	return st.RaftIndex, nil
}

// hotName: Contenders goroutines on one name for Duration. Each holder
// counts itself in an atomic (the most at once must be 1), and the gap is
// from the moment a holder starts its release to the moment the next
// holder's Lock returns. At the end, waiters are cancelled.
func hotName(ctx context.Context, cfg Config, impl Impl, res *Result, e *benchkit.Errs) error {
	ls, err := newLockers(ctx, impl, cfg.Contenders)
	if err != nil {
		return err
	}
	defer closeLockers(ls)
	var (
		holders, most atomic.Int64
		wg            sync.WaitGroup

		mu          sync.Mutex // the lock under test already serialises these; the race detector wants it
		lastRelease time.Time  // when the last holder began its release
		lastHolder  = -1
		acquired    int
		toOther     int
		gaps, waits []time.Duration
	)
	sctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	end, _ := sctx.Deadline()
	start := time.Now()
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sctx.Err() == nil && !e.TooMany() {
				asked := time.Now()
				unlock, err := l.Lock(sctx, "bench-hot")
				if err != nil {
					// A client that honours the deadline itself (go-redis
					// with ContextTimeoutEnabled) can report it a moment
					// before sctx's own timer marks sctx done.
					if sctx.Err() == nil && time.Now().Before(end) {
						e.Add(fmt.Errorf("hot name: %w", err))
					}
					continue
				}
				now := time.Now()
				n := holders.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				mu.Lock()
				if !lastRelease.IsZero() {
					gaps = append(gaps, now.Sub(lastRelease))
				}
				waits = append(waits, now.Sub(asked))
				if lastHolder >= 0 && lastHolder != i {
					toOther++
				}
				lastHolder = i
				acquired++
				mu.Unlock()

				holders.Add(-1)
				mu.Lock()
				lastRelease = time.Now()
				mu.Unlock()
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
				if err := unlock(uctx); err != nil {
					e.Add(fmt.Errorf("hot name: release: %w", err))
				}
				ucancel()
			}
		}()
	}
	wg.Wait()
	res.HotElapsed += time.Since(start)
	res.Acquisitions += acquired
	res.ToOther += toOther
	res.MaxHolders = max(res.MaxHolders, most.Load())
	res.gaps = append(res.gaps, gaps...)
	res.waits = append(res.waits, waits...)
	return ctx.Err()
}
