// Package httpbench measures what the HTTP API costs on top of the
// in-process SDK, in one process and one run, against one lease store:
//
//   - SDK: lock.Client.TryAcquire and Lease.Release, in process;
//   - HTTP: client.Client.TryAcquire and Lease.Release against server.New
//     over that same lock.Client, served by net/http on a loopback TCP
//     listener.
//
// Both paths therefore share the lease store, the sequencer and the Redis
// and etcd connections; the difference between them is the API: JSON,
// HTTP/1.1 over loopback TCP, the server's handler and the client.
//
// Two more paths are controls. The HTTP floor is the same HTTP client
// against a handler that answers acquire and release with canned JSON:
// net/http, JSON and the client, with no authentication, metrics, logging
// or lease store. Its CPU per pair is what any request-per-operation HTTP
// API over loopback costs here, before it does anything; SDK plus floor
// bounds what the HTTP path can reach on a machine whose cores it
// saturates. HTTP bare is that client against a minimal handler that makes
// the server's lock.Client calls and nothing else: what any Go HTTP server
// in front of the SDK costs, so that HTTP less bare is what fenced's server
// adds (authentication, validation, metrics, logging).
//
// Two scenarios, the paths taking turns in rounds with the order rotating:
// uncontended acquire+release latency (one goroutine, one name, sequential)
// and throughput of many goroutines on distinct names. Before them, a few
// sequential acquisitions of one name, alternating the paths, record their
// tokens: a check that both paths reach the same store. [Run] measures,
// [Write] prints the table.
//
// TryAcquire is used on both paths: every name is free when taken, so it is
// what Acquire does too, without the HTTP client's wait_ms; a held name
// would show up as an error rather than a wait.
package httpbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced/fenced/bench/internal/benchkit"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/fenced/fenced/server"
	"github.com/redis/go-redis/v9"
)

// Lease stores.
const (
	StoreRedis = "redis" // leases in Redis, tokens from the etcd sequencer
	StoreEtcd  = "etcd"  // leases and tokens in etcd
)

// Paths, the rows of the table.
const (
	SDK   = "SDK"
	HTTP  = "HTTP"
	Bare  = "HTTP bare"
	Floor = "HTTP floor"
)

// allPaths are the paths in the order they are measured.
var allPaths = []string{SDK, HTTP, Bare, Floor}

// PathNamed is the path s names, in any case, "bare" and "floor" for short;
// s itself if none.
func PathNamed(s string) string {
	for _, p := range allPaths {
		if strings.EqualFold(s, p) || strings.EqualFold("HTTP "+s, p) {
			return p
		}
	}
	return s
}

// Config says what to run. DefaultConfig and ShortConfig give the usual
// values.
type Config struct {
	Store     string // StoreRedis or StoreEtcd
	RedisAddr string // with StoreRedis
	TTL       time.Duration
	// Iterations: uncontended acquire+release pairs per path in all, split
	// between the rounds, each round after a warm-up of a tenth as many.
	Iterations int
	Duration   time.Duration // of the throughput scenario, per path per round
	Clients    int           // throughput: goroutines, each on its own name
	Rounds     int           // each runs both paths once, the order rotating
	Checks     int           // sequential acquisitions of one name whose tokens are recorded
	// Only, if not empty, names the paths to measure (SDK, HTTP, Bare,
	// Floor); the check runs on SDK and HTTP whatever it says.
	Only []string
	// Log, if set, receives a line as each path starts a round, and the
	// server's warnings.
	Log io.Writer
}

// benchToken is the server's one bearer token: a benchmark's, not a secret.
const benchToken = "httpbench-0123456789abcdef0123456789abcdef"

// DefaultConfig is the full benchmark.
func DefaultConfig() Config {
	return Config{
		Store:      StoreRedis,
		RedisAddr:  "127.0.0.1:6379",
		TTL:        5 * time.Second,
		Iterations: 1000,
		Duration:   3 * time.Second,
		Clients:    64,
		Rounds:     3,
		Checks:     6,
	}
}

// ShortConfig is a quick run: the same scenarios, much shorter.
func ShortConfig() Config {
	c := DefaultConfig()
	c.Iterations = 50
	c.Duration = 300 * time.Millisecond
	c.Rounds = 2
	return c
}

func (c Config) validate() error {
	switch {
	case c.Store != StoreRedis && c.Store != StoreEtcd:
		return fmt.Errorf("httpbench: store %q: want %s or %s", c.Store, StoreRedis, StoreEtcd)
	case c.TTL < 2*time.Second:
		return fmt.Errorf("httpbench: ttl %s: want >= 2s (etcd leases)", c.TTL)
	case c.Iterations < 1 || c.Duration <= 0 || c.Clients < 1 || c.Rounds < 1 || c.Checks < 2:
		return errors.New("httpbench: want iterations >= 1, duration > 0, clients >= 1, rounds >= 1, checks >= 2")
	}
	for _, p := range c.Only {
		if !slices.Contains(allPaths, p) {
			return fmt.Errorf("httpbench: only %q: want some of %q (or bare, floor), comma-separated", p, allPaths)
		}
	}
	return nil
}

// Result is what one path did.
type Result struct {
	Path string

	Uncontended    int // pairs measured
	UncP50, UncP99 time.Duration
	// Acquire and Release split the uncontended pairs into their two
	// requests, p50s.
	Acquire, Release Step

	Ops          int // throughput: acquire+release pairs
	OpsElapsed   time.Duration
	RoundOpsRate []float64 // ops/s of each round
	// ProcCPU is the CPU time of this whole process (clients, server, lock
	// client, embedded etcd) in the throughput scenario.
	ProcCPU time.Duration
	// PairTime is the time of the throughput scenario's pairs, summed;
	// HandlerTime, for the HTTP paths, the time their requests spent in
	// the server's handler, summed: the rest of a pair is the way to the
	// server and back, which under load includes waiting for a CPU.
	PairTime, HandlerTime time.Duration

	Errors   int
	FirstErr error

	unc   []time.Duration       // samples of every round
	steps [2][4][]time.Duration // acquire, release: samples of each Step field
}

// Step is one request of the uncontended pairs, p50s: the call, and for
// the HTTP paths where its time went, from the server handler's start and
// end as a timing wrapper around it records them. The parts' p50s need not
// add up to the call's.
type Step struct {
	Call     time.Duration
	ToServer time.Duration // from the call to the handler's start: the client, the loopback, net/http's reading of the request
	InServer time.Duration // the handler: for HTTP, authentication, decoding, the lock.Client call, the answer, metrics
	Back     time.Duration // from the handler's end to the call's return: the answer's flush, the loopback, the client
}

// OpsPerSec is the throughput scenario's acquire+release pairs per second.
func (r Result) OpsPerSec() float64 {
	if r.OpsElapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.OpsElapsed.Seconds()
}

// CPUPerOp is this process's CPU time per acquire+release in the
// throughput scenario.
func (r Result) CPUPerOp() time.Duration {
	if r.Ops == 0 {
		return 0
	}
	return r.ProcCPU / time.Duration(r.Ops)
}

// Check is one acquisition of the check name.
type Check struct {
	Path  string
	Token fence.Token
}

// Report is a whole run.
type Report struct {
	Config  Config
	Store   string // what the leases and tokens are kept in
	Load    string // load averages before and after, from /proc/loadavg
	Checks  []Check
	Results []Result // SDK, HTTP, HTTP bare, then the HTTP floor
}

// Find returns the result of path, nil if there is none.
func (rep *Report) Find(path string) *Result {
	for i := range rep.Results {
		if rep.Results[i].Path == path {
			return &rep.Results[i]
		}
	}
	return nil
}

// acquirer is how a path takes a lease; both return a *lock.Lease whose
// Release goes the same way.
type acquirer func(ctx context.Context, name string) (*lock.Lease, error)

// Run sets up the lease store, the lock client, the HTTP server and the HTTP
// client, and measures both paths.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	run, err := benchkit.RunID()
	if err != nil {
		return nil, err
	}
	env, err := start(ctx, cfg, run)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := env.close(); cerr != nil {
			rep, err = nil, errors.Join(err, cerr)
		}
	}()

	paths := []path{
		{SDK, func(ctx context.Context, name string) (*lock.Lease, error) {
			return env.locks.TryAcquire(ctx, name, cfg.TTL)
		}, nil},
		{HTTP, func(ctx context.Context, name string) (*lock.Lease, error) {
			return env.http.c.TryAcquire(ctx, name, cfg.TTL)
		}, env.http.stamps},
		{Bare, func(ctx context.Context, name string) (*lock.Lease, error) {
			return env.bare.c.TryAcquire(ctx, name, cfg.TTL)
		}, env.bare.stamps},
		{Floor, func(ctx context.Context, name string) (*lock.Lease, error) {
			return env.floor.c.TryAcquire(ctx, name, cfg.TTL)
		}, env.floor.stamps},
	}
	rep = &Report{Config: cfg, Store: env.desc}
	loadBefore := benchkit.Loadavg()

	// The check: one name, sequential, the paths alternating.
	checkName := "httpbench-" + run + "-check"
	checked := paths[:2] // SDK and HTTP: the floor's tokens are canned
	if len(cfg.Only) > 0 {
		paths = slices.DeleteFunc(slices.Clone(paths), func(p path) bool { return !slices.Contains(cfg.Only, p.name) })
	}
	for i := range cfg.Checks {
		p := checked[i%2]
		var tok fence.Token
		if err := pair(ctx, p.acq, checkName, &tok); err != nil {
			return nil, fmt.Errorf("httpbench: check, %s: %w", p.name, err)
		}
		rep.Checks = append(rep.Checks, Check{Path: p.name, Token: tok})
	}

	res := make([]Result, len(paths))
	counts := make([]benchkit.Errs, len(paths))
	for i, p := range paths {
		res[i].Path = p.name
	}
	n := max(cfg.Iterations/cfg.Rounds, 1)
	for round := range cfg.Rounds {
		for k := range paths {
			i := (round + k) % len(paths)
			p := paths[i]
			if cfg.Log != nil {
				fmt.Fprintf(cfg.Log, "httpbench: round %d/%d: %s\n", round+1, cfg.Rounds, p.name)
			}
			prefix := fmt.Sprintf("httpbench-%s-%s", run, strings.ReplaceAll(strings.ToLower(p.name), " ", "-"))
			if err := uncontended(ctx, n, p.acq, p.stamps, prefix+"-unc", &res[i], &counts[i]); err != nil {
				return nil, fmt.Errorf("httpbench: %s: %w", p.name, err)
			}
			if err := throughput(ctx, cfg, p.acq, p.stamps, prefix+"-tp-", &res[i], &counts[i]); err != nil {
				return nil, fmt.Errorf("httpbench: %s: %w", p.name, err)
			}
		}
	}
	for i := range res {
		r := &res[i]
		r.Errors, r.FirstErr = counts[i].Result()
		r.Uncontended = len(r.unc)
		r.UncP50, r.UncP99 = benchkit.Percentile(r.unc, 50), benchkit.Percentile(r.unc, 99)
		r.Acquire, r.Release = r.step(0), r.step(1)
	}
	rep.Results = res
	rep.Load = loadBefore + " before, " + benchkit.Loadavg() + " after"
	return rep, nil
}

// path is one way to acquire and release.
type path struct {
	name   string
	acq    acquirer
	stamps *stamps // of the path's server, if it has one
}

// env is what one run sets up; close takes it down in reverse order.
type env struct {
	desc    string
	closers []func() error // in the order of setup
	locks   *lock.Client
	http    served // fenced's server
	bare    served // the minimal handler
	floor   served // the canned handler
}

// served is an HTTP client of a server, and the stamps of its handler.
type served struct {
	c      *client.Client
	stamps *stamps
}

func (e *env) close() error {
	var err error
	for _, c := range slices.Backward(e.closers) {
		err = errors.Join(err, c())
	}
	e.closers = nil
	return err
}

// closeCtx bounds the Close calls that release leases still held.
func closeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func start(ctx context.Context, cfg Config, run string) (_ *env, err error) {
	e := &env{}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()

	etcd, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{}) // fsync on
	if err != nil {
		return nil, fmt.Errorf("httpbench: embedded etcd: %w", err)
	}
	e.closers = append(e.closers, etcd.Close)
	cli, err := etcd.Client()
	if err != nil {
		return nil, fmt.Errorf("httpbench: etcd client: %w", err)
	}
	e.closers = append(e.closers, cli.Close)

	var store lock.LeaseStore
	switch cfg.Store {
	case StoreRedis:
		rdb := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, PoolSize: cfg.Clients + 16, ContextTimeoutEnabled: true})
		e.closers = append(e.closers, rdb.Close)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("httpbench: Redis at %s does not answer (%w): start it (redis-server --port 6379) or set FENCED_TEST_REDIS", cfg.RedisAddr, err)
		}
		seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix("/httpbench/"+run+"/seq/"))
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, seq.Close)
		rs, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix("httpbench:"+run+":"))
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, rs.Close)
		store = rs
		e.desc = fmt.Sprintf("leases in Redis at %s, tokens from the etcd sequencer", cfg.RedisAddr)
	case StoreEtcd:
		es, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix("/httpbench/"+run+"/locks/"))
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, es.Close)
		store = es
		e.desc = "leases and tokens in etcd"
	}
	e.desc += "; embedded etcd, 1 member, fsync on"

	e.locks, err = lock.New(store)
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, func() error {
		ctx, cancel := closeCtx()
		defer cancel()
		return e.locks.Close(ctx)
	})

	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	// fenced serve's settings: a bearer token limited to the benchmark's
	// names (so every request is authenticated and its scope checked),
	// metrics on (server.New's private registry), logs at warn.
	secret := []byte(benchToken)
	tokens, err := server.NewTokens(server.Token{Name: "httpbench", Secret: secret, Prefixes: []string{"httpbench-"}})
	if err != nil {
		return nil, err
	}
	h, err := server.New(server.Config{
		Locks:  e.locks,
		Logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Tokens: tokens,
	})
	if err != nil {
		return nil, err
	}
	// The client as a user gets it: its default transport keeps an idle
	// connection per goroutine (client.DefaultIdleConns).
	if e.http, err = e.serve(h, true); err != nil {
		return nil, err
	}
	if e.bare, err = e.serve(bareHandler(e.locks), false); err != nil {
		return nil, err
	}
	if e.floor, err = e.serve(floorHandler(), false); err != nil {
		return nil, err
	}
	return e, nil
}

// stamps records when a server's handler last started and ended, for the
// split of the uncontended requests, which come one at a time: the last
// stamps after a call are its request's; and the handlers' time summed, for
// the split of a pair under load. Two clock reads a request.
type stamps struct {
	base       time.Time
	start, end atomic.Int64 // since base
	busy       atomic.Int64 // the handlers' time, summed
}

func newStamps() *stamps { return &stamps{base: time.Now()} }

// now is the monotonic time since base.
func (s *stamps) now() int64 { return int64(time.Since(s.base)) }

func (s *stamps) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := s.now()
		s.start.Store(start)
		h.ServeHTTP(w, r)
		end := s.now()
		s.end.Store(end)
		s.busy.Add(end - start)
	})
}

// serve serves h, timed by stamps, on a loopback port and returns a client
// of it; both are closed with e.
func (e *env) serve(h http.Handler, auth bool) (served, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return served{}, err
	}
	st := newStamps()
	hs := &http.Server{Handler: st.wrap(h), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	e.closers = append(e.closers, func() error {
		ctx, cancel := closeCtx()
		defer cancel()
		err := hs.Shutdown(ctx)
		if serr := <-serveErr; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	})
	var opts []client.Option
	if auth {
		opts = append(opts, client.WithBearerToken(benchToken))
	}
	c, err := client.New("http://"+ln.Addr().String(), opts...)
	if err != nil {
		return served{}, err
	}
	e.closers = append(e.closers, func() error {
		ctx, cancel := closeCtx()
		defer cancel()
		return c.Close(ctx)
	})
	return served{c, st}, nil
}

// minimalHandler serves acquire and release in the API's shapes, decoding
// each request as the server does, and does their work with acquire and
// release; an error answers 503. It does nothing else: no authentication,
// metrics or logging.
func minimalHandler(acquire func(ctx context.Context, name string, ttl time.Duration) (api.Lease, error),
	release func(ctx context.Context, name, leaseID string) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/locks/{name}/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req api.AcquireRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.TTLMs == nil {
			http.Error(w, `{"error":{"code":"invalid","message":"want ttl_ms"}}`, http.StatusBadRequest)
			return
		}
		l, err := acquire(r.Context(), r.PathValue("name"), time.Duration(*req.TTLMs)*time.Millisecond)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(l)
	})
	mux.HandleFunc("POST /v1/locks/{name}/release", func(w http.ResponseWriter, r *http.Request) {
		var req api.ReleaseRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":{"code":"invalid","message":"want lease_id"}}`, http.StatusBadRequest)
			return
		}
		if err := release(r.Context(), r.PathValue("name"), req.LeaseID); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}\n")
	})
	return mux
}

// bareHandler makes the lock.Client calls fenced's server makes for
// acquire and release (a detached lease, a release by lease id, each
// bounded as the server bounds them), and nothing else.
func bareHandler(locks *lock.Client) http.Handler {
	return minimalHandler(func(ctx context.Context, name string, ttl time.Duration) (api.Lease, error) {
		ctx, cancel := context.WithTimeout(ctx, server.DefaultBackendTimeout)
		defer cancel()
		l, err := locks.TryAcquire(ctx, name, ttl, lock.WithDetached())
		if err != nil {
			return api.Lease{}, err
		}
		return api.Lease{Name: name, LeaseID: l.ID(), Token: l.Token(), TTLMs: l.TTL().Milliseconds()}, nil
	}, func(ctx context.Context, name, leaseID string) error {
		ctx, cancel := context.WithTimeout(ctx, server.DefaultBackendTimeout)
		defer cancel()
		return locks.ReleaseID(ctx, name, leaseID, "")
	})
}

// floorHandler answers from nothing: a lease id and a growing token for
// every acquire, {} for every release.
func floorHandler() http.Handler {
	var token atomic.Int64
	return minimalHandler(func(_ context.Context, name string, ttl time.Duration) (api.Lease, error) {
		return api.Lease{Name: name, LeaseID: "0123456789abcdef0123456789abcdef", Token: fence.Token(token.Add(1)), TTLMs: ttl.Milliseconds()}, nil
	}, func(context.Context, string, string) error { return nil })
}

// opTimeout bounds one acquire+release pair; nothing healthy comes near it.
const opTimeout = 30 * time.Second

// pair is one acquire+release; tok, if not nil, receives the token.
func pair(ctx context.Context, acq acquirer, name string, tok *fence.Token) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	l, err := acq(octx, name)
	if err != nil {
		return err
	}
	if tok != nil {
		*tok = l.Token()
	}
	return l.Release(octx)
}

// uncontended: n sequential pairs on one name after a warm-up of a tenth
// as many, each request timed, and split where st records its server.
func uncontended(ctx context.Context, n int, acq acquirer, st *stamps, name string, res *Result, e *benchkit.Errs) error {
	if st == nil {
		st = newStamps() // for its clock
	}
	warm := max(n/10, 5)
	for i := 0; i < warm+n && !e.TooMany(); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		t0 := st.now()
		l, err := acq(octx, name)
		t1 := st.now()
		var acqStart, acqEnd int64
		if err == nil {
			acqStart, acqEnd = st.start.Load(), st.end.Load()
			err = l.Release(octx)
		}
		t2 := st.now()
		cancel()
		if err != nil {
			e.Add(fmt.Errorf("uncontended: %w", err))
			continue
		}
		if i >= warm {
			res.unc = append(res.unc, time.Duration(t2-t0))
			res.addStep(0, t0, t1, acqStart, acqEnd)
			res.addStep(1, t1, t2, st.start.Load(), st.end.Load())
		}
	}
	return nil
}

// addStep records request k (0 acquire, 1 release), called at from and
// returned at to, whose handler (if any) ran from start to end.
func (r *Result) addStep(k int, from, to, start, end int64) {
	r.steps[k][0] = append(r.steps[k][0], time.Duration(to-from))
	if start >= from && end >= start && to >= end { // the stamps are this request's
		r.steps[k][1] = append(r.steps[k][1], time.Duration(start-from))
		r.steps[k][2] = append(r.steps[k][2], time.Duration(end-start))
		r.steps[k][3] = append(r.steps[k][3], time.Duration(to-end))
	}
}

// step is request k's split, p50s; no parts without a server.
func (r *Result) step(k int) Step {
	p := func(i int) time.Duration { return benchkit.Percentile(r.steps[k][i], 50) }
	if len(r.steps[k][1]) == 0 {
		return Step{Call: p(0)}
	}
	return Step{Call: p(0), ToServer: p(1), InServer: p(2), Back: p(3)}
}

// throughput: Clients goroutines, each on its own name, acquire and release
// for Duration. Pairs in flight at the end complete and count; the elapsed
// time runs until the last one has. st, if the path has a server, sums its
// handlers' time.
func throughput(ctx context.Context, cfg Config, acq acquirer, st *stamps, prefix string, res *Result, e *benchkit.Errs) error {
	var (
		stop     atomic.Bool
		ops      atomic.Int64
		pairTime atomic.Int64
		wg       sync.WaitGroup
	)
	var busy0 int64
	if st != nil {
		busy0 = st.busy.Load()
	}
	cpu0 := benchkit.ProcessCPU()
	start := time.Now()
	timer := time.AfterFunc(cfg.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	for i := range cfg.Clients {
		wg.Go(func() {
			name := fmt.Sprintf("%s%d", prefix, i)
			var spent time.Duration
			for !stop.Load() && ctx.Err() == nil && !e.TooMany() {
				t0 := time.Now()
				if err := pair(ctx, acq, name, nil); err != nil {
					e.Add(fmt.Errorf("throughput: %w", err))
					continue
				}
				spent += time.Since(t0)
				ops.Add(1)
			}
			pairTime.Add(int64(spent))
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	res.ProcCPU += benchkit.ProcessCPU() - cpu0
	res.PairTime += time.Duration(pairTime.Load())
	if st != nil {
		res.HandlerTime += time.Duration(st.busy.Load() - busy0)
	}
	n := int(ops.Load())
	res.Ops += n
	res.OpsElapsed += elapsed
	res.RoundOpsRate = append(res.RoundOpsRate, float64(n)/elapsed.Seconds())
	return ctx.Err()
}
