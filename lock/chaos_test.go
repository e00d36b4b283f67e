package lock_test

// A randomized fault test: workers in two "processes" (each its own
// links, store and lock.Client) take, refresh, reenter and release locks on
// a few names while a nemesis breaks the links at random (cuts, refused
// connections, partitions longer than a TTL, latency, lost replies). The
// history is then checked against the guarantees of docs/design.md, and the
// names must be free and the stores empty once the faults end. The
// hand-picked fault tests elsewhere put one fault at one moment; this one
// looks for the interleavings nobody thought of.
//
// FENCED_CHAOS=5m runs each store that long (default a few seconds, as CI
// runs it); FENCED_CHAOS_SEED=n repeats a run's choices (the scheduler's
// are its own). See docs/design.md, "Under random faults".

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	chaosProcs   = 2
	chaosWorkers = 3 // per process
	chaosNames   = 2
	chaosMaxTTL  = 2 * time.Second
)

var chaosTTLs = []time.Duration{300 * time.Millisecond, 700 * time.Millisecond, time.Second, chaosMaxTTL}

// chaosSetup is one store kind: the processes' lock clients and links, and
// a store behind no proxy for the checks after the faults.
type chaosSetup struct {
	procs  []*lock.Client
	links  [][]*faultproxy.Proxy // per process; with Redis leases, Redis's first
	lossy  []byte                // a pattern of Redis's requests whose reply can be lost; nil: none
	direct *lock.Client
	keysOf func() []string // the store's keys of the locks
	etcd   []*sequencer.Embedded
	redis  *testenv.RedisProc // nil with etcd leases
}

func TestChaos(t *testing.T) {
	t.Parallel()
	d := 8 * time.Second
	if v := os.Getenv("FENCED_CHAOS"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("FENCED_CHAOS=%q: want a duration such as 5m", v)
		}
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("FENCED_CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("FENCED_CHAOS_SEED=%q: want an integer", v)
		}
	}
	for i, kind := range []string{"redis", "etcd"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			t.Logf("seed %d (FENCED_CHAOS_SEED=%d repeats the choices)", seed, seed)
			var s chaosSetup
			if kind == "redis" {
				s = chaosRedis(t)
			} else {
				s = chaosEtcd(t)
			}
			runChaos(t, s, d, seed+int64(i))
		})
	}
}

// chaosEtcdLink is a client of every member of an etcd cluster, each
// reached through a proxy of its own.
func chaosEtcdLink(t *testing.T, members []*sequencer.Embedded) ([]*faultproxy.Proxy, *clientv3.Client) {
	var ps []*faultproxy.Proxy
	var eps []string
	for _, m := range members {
		p, err := faultproxy.New(strings.TrimPrefix(m.ClientURL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ps = append(ps, p)
		eps = append(eps, p.Addr())
	}
	return ps, testenv.EtcdClient(t, eps...)
}

// chaosRedis: Redis leases on a Redis of the test's own (the nemesis
// pauses it), tokens from a three-member etcd cluster; each process
// reaches Redis and every member through proxies of its own.
func chaosRedis(t *testing.T) chaosSetup {
	s := chaosSetup{etcd: testenv.EtcdCluster(t, 3), redis: testenv.StartRedis(t), lossy: []byte("EVALSHA")}
	addr := fmt.Sprint("127.0.0.1:", s.redis.Port())
	direct := s.redis.Client()
	prefix := testenv.Name(t) + ":"
	newStore := func(rdb *redis.Client, ecli *clientv3.Client) *lock.Client {
		seq, err := sequencer.NewEtcd(ecli)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { seq.Close() })
		st, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return newClient(t, st)
	}
	for range chaosProcs {
		rp, err := faultproxy.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rp.Close() })
		// As fenced serve builds it: a call ends at its context's deadline.
		rdb := redis.NewClient(&redis.Options{Addr: rp.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		eps, ecli := chaosEtcdLink(t, s.etcd)
		s.procs = append(s.procs, newStore(rdb, ecli))
		s.links = append(s.links, append([]*faultproxy.Proxy{rp}, eps...))
	}
	s.direct = newStore(direct, testenv.ClusterClient(t, s.etcd))
	s.keysOf = func() []string {
		keys, err := direct.Keys(context.Background(), prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	return s
}

// chaosEtcd: etcd leases on a three-member cluster; each process reaches
// every member through a proxy of its own.
func chaosEtcd(t *testing.T) chaosSetup {
	s := chaosSetup{etcd: testenv.EtcdCluster(t, 3)}
	prefix := "/" + testenv.Name(t) + "/"
	newStore := func(ecli *clientv3.Client) *lock.Client {
		return newClient(t, newEtcdStore(t, ecli, lock.WithEtcdPrefix(prefix)))
	}
	for range chaosProcs {
		eps, ecli := chaosEtcdLink(t, s.etcd)
		s.procs = append(s.procs, newStore(ecli))
		s.links = append(s.links, eps)
	}
	cli := testenv.ClusterClient(t, s.etcd)
	s.direct = newStore(cli)
	s.keysOf = func() []string {
		r, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range r.Kvs {
			// The token's counter and floor stay, one each per store.
			if k := string(kv.Key); k != prefix+"counter" && k != prefix+"floor" {
				keys = append(keys, k)
			}
		}
		return keys
	}
	return s
}

// chaosGrant is one grant (one lease id) as its holder saw it.
type chaosGrant struct {
	name    string
	who     string // process and worker
	id      string
	token   fence.Token
	invoked time.Time // the Acquire call that granted it began
	granted time.Time // and returned
	// believed is the last instant the holder checked that it held the
	// lock (its deadline ahead, not lost) and found it did: the end of the
	// span in which it would have written. Zero: never.
	first, believed time.Time
}

// chaosLog collects grants by lease id.
type chaosLog struct {
	mu     sync.Mutex
	grants map[string]*chaosGrant
	ops    map[string]int // outcomes by kind, for the log and the sanity check
}

func (h *chaosLog) count(what string) {
	h.mu.Lock()
	h.ops[what]++
	h.mu.Unlock()
}

// granted records a grant, or a reentry of one (same id).
func (h *chaosLog) granted(t *testing.T, who, name string, l *lock.Lease, invoked, granted time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g, ok := h.grants[l.ID()]; ok {
		if g.token != l.Token() || g.name != name {
			t.Errorf("lease %s granted again as %s token %d, first %s token %d", l.ID(), name, l.Token(), g.name, g.token)
		}
		return
	}
	h.grants[l.ID()] = &chaosGrant{name: name, who: who, id: l.ID(), token: l.Token(), invoked: invoked, granted: granted}
}

// holds is the holder's check before it would write: the lease is not
// lost and its deadline is ahead.
func (h *chaosLog) holds(l *lock.Lease) {
	dl := l.Deadline()
	now := time.Now()
	if !now.Before(dl) || l.Err() != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.grants[l.ID()]
	if g.first.IsZero() {
		g.first = now
	}
	g.believed = now
}

func runChaos(t *testing.T, s chaosSetup, d time.Duration, seed int64) {
	h := &chaosLog{grants: map[string]*chaosGrant{}, ops: map[string]int{}}
	names := make([]string, chaosNames)
	for i := range names {
		names[i] = testenv.Name(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()

	var wg sync.WaitGroup
	done := make(chan string, chaosProcs*chaosWorkers+1)
	for p, c := range s.procs {
		for w := range chaosWorkers {
			who := fmt.Sprintf("p%dw%d", p, w)
			r := rand.New(rand.NewPCG(uint64(seed), uint64(p*chaosWorkers+w+1)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					chaosStep(t, ctx, h, c, who, names[r.IntN(len(names))], r)
				}
				done <- who
			}()
		}
	}
	faults := map[string]int{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		nemesis(ctx, t, s, rand.New(rand.NewPCG(uint64(seed), 0)), faults)
		done <- "nemesis"
	}()
	// Every worker ends its step after the faults end: an acquisition's
	// wait, a hold and its release are bounded (chaosStep), so one that
	// does not return in a minute is stuck.
	stuck := time.After(d + time.Minute)
	for left := chaosProcs*chaosWorkers + 1; left > 0; left-- {
		select {
		case <-done:
		case <-stuck:
			t.Fatalf("%d of the workers and nemesis still running a minute after the faults ended: a call did not return", left)
		}
	}
	wg.Wait()
	t.Logf("%s of faults: %v; outcomes: %v; %d grants", d, faults, h.ops, len(h.grants))
	for what := range h.ops {
		if strings.Contains(what, " other: ") {
			t.Errorf("an outcome no fault explains: %s", what)
		}
	}
	if len(h.grants) < 5 {
		t.Fatalf("only %d grants in %s: the workload made no progress to check", len(h.grants), d)
	}
	checkChaosHistory(t, h)

	// Once the faults are over, every name is free within the longest TTL
	// and a queue place's life (a release or leave whose reply was lost),
	// and nothing of the locks is left in the store after that.
	for _, name := range names {
		l, err := s.direct.Acquire(t.Context(), name, time.Second, lock.WithWait(chaosMaxTTL+lock.DefaultWaiterTTL+3*time.Second))
		if err != nil {
			t.Fatalf("%s after the faults: %v", name, err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	keys := s.keysOf()
	t.Logf("keys of the locks in the store once every name was free: %q", keys)
	deadline := time.Now().Add(chaosMaxTTL + lock.DefaultWaiterTTL + 10*time.Second)
	for ; len(keys) > 0; keys = s.keysOf() {
		if time.Now().After(deadline) {
			t.Fatalf("keys of the locks still in the store after every lease and queue place expired: %q", keys)
		}
		time.Sleep(20 * time.Millisecond) // polling the store, which says nothing when a key expires
	}
}

// chaosStep is one worker's acquisition, hold and release of name, each
// choice random: a try or a wait, fair or not, reentrant or not, refreshed
// or kept alive or neither.
func chaosStep(t *testing.T, ctx context.Context, h *chaosLog, c *lock.Client, who, name string, r *rand.Rand) {
	ttl := chaosTTLs[r.IntN(len(chaosTTLs))]
	var opts []lock.Option
	if r.IntN(3) == 0 {
		opts = append(opts, lock.WithUnfair())
	}
	reentrant := r.IntN(4) == 0
	if reentrant {
		opts = append(opts, lock.WithHolder(who))
	}
	// A long hold works past its TTL, looking before each write whether it
	// still holds the lock: with a keep-alive that a fault can stop, or
	// without, where only the deadline ends it.
	long := r.IntN(3) == 0
	if r.IntN(4) == 0 || long && r.IntN(3) != 0 {
		opts = append(opts, lock.WithKeepAlive())
	}
	wait := time.Duration(r.IntN(1000)) * time.Millisecond
	if r.IntN(4) != 0 {
		opts = append(opts, lock.WithWait(wait))
	}
	// The call's context bounds it where a partition would hold it.
	actx, cancel := context.WithTimeout(ctx, wait+2*time.Second)
	defer cancel()
	invoked := time.Now()
	l, err := c.Acquire(actx, name, ttl, opts...)
	if err != nil {
		h.count(chaosOutcome("acquire", err))
		return
	}
	h.granted(t, who, name, l, invoked, time.Now())
	h.count("granted")
	held := []*lock.Lease{l}
	if long {
		for end := time.Now().Add(ttl/2 + time.Duration(r.Int64N(int64(3*ttl/2)))); time.Now().Before(end); {
			h.holds(l)
			time.Sleep(ttl / 10)
		}
	}
	for range 1 + r.IntN(3) {
		h.holds(l)
		time.Sleep(time.Duration(r.Int64N(int64(ttl / 3)))) // the work under the lock
		h.holds(l)
		switch r.IntN(3) {
		case 0:
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := l.Refresh(rctx, chaosTTLs[r.IntN(len(chaosTTLs))])
			cancel()
			h.count(chaosOutcome("refresh", err))
		case 1:
			if reentrant {
				invoked := time.Now()
				actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				again, err := c.TryAcquire(actx, name, ttl, lock.WithHolder(who))
				cancel()
				h.count(chaosOutcome("reenter", err))
				if err == nil {
					h.granted(t, who, name, again, invoked, time.Now())
					held = append(held, again)
				}
			}
		}
	}
	h.holds(l)
	for i := len(held) - 1; i >= 0; i-- {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := held[i].Release(rctx)
		cancel()
		h.count(chaosOutcome("release", err))
	}
}

// chaosOutcome names an outcome for the log: op and the error's kind,
// "other: ..." for an error none of the kinds a fault explains.
func chaosOutcome(op string, err error) string {
	var held *lock.HeldError
	var be *lock.BackendError
	switch {
	case err == nil:
		return op + " ok"
	case errors.As(err, &held), errors.Is(err, lock.ErrNotAcquired):
		return op + " held"
	case errors.Is(err, lock.ErrLost):
		return op + " lost"
	case errors.As(err, &be):
		return op + " backend"
	case errors.Is(err, context.DeadlineExceeded):
		return op + " deadline"
	default:
		return op + " other: " + err.Error()
	}
}

// nemesis breaks a random process's links, or the servers, one fault at
// a time, until ctx ends, and heals everything at the end.
func nemesis(ctx context.Context, t *testing.T, s chaosSetup, r *rand.Rand, faults map[string]int) {
	defer func() {
		for _, links := range s.links {
			for _, p := range links {
				p.Hold(false)
				p.Refuse(false)
				p.SetLatency(0)
			}
		}
	}()
	pause := func(max time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(r.Int64N(int64(max)))):
			return true
		}
	}
	kinds := []string{"cut", "refuse", "partition", "latency", "etcd leader restarted", "none"}
	if s.redis != nil {
		kinds = append(kinds, "lost reply", "redis paused")
	}
	for pause(400 * time.Millisecond) {
		// One link of a process, or all of them (a process cut off).
		pi := r.IntN(len(s.links))
		links := s.links[pi]
		if i := r.IntN(len(links) + 1); i < len(links) {
			links = links[i : i+1]
		}
		each := func(f func(*faultproxy.Proxy)) {
			for _, p := range links {
				f(p)
			}
		}
		kind := kinds[r.IntN(len(kinds))]
		faults[kind]++
		switch kind {
		case "cut":
			each((*faultproxy.Proxy).CutAll)
		case "refuse":
			each(func(p *faultproxy.Proxy) { p.CutAll(); p.Refuse(true) })
			pause(time.Second)
			each(func(p *faultproxy.Proxy) { p.Refuse(false) })
		case "partition":
			// Longer than the shorter TTLs: holders must stop believing
			// before another is granted.
			each(func(p *faultproxy.Proxy) { p.Hold(true) })
			pause(3 * time.Second)
			each(func(p *faultproxy.Proxy) { p.Hold(false) })
		case "latency":
			d := time.Duration(1+r.IntN(50)) * time.Millisecond
			each(func(p *faultproxy.Proxy) { p.SetLatency(d) })
			pause(time.Second)
			each(func(p *faultproxy.Proxy) { p.SetLatency(0) })
		case "lost reply":
			s.links[pi][0].LoseReply(s.lossy)
		case "redis paused":
			s.redis.Stop()
			pause(3 * time.Second)
			s.redis.Cont()
		case "etcd leader restarted":
			i := slices.IndexFunc(s.etcd, (*sequencer.Embedded).IsLeader)
			if i < 0 {
				faults["etcd leader restarted, none leading"]++
				continue
			}
			s.etcd[i].Close()
			pause(2 * time.Second)
			if _, err := testenv.RestartMember(t, s.etcd, i); err != nil {
				t.Error(err)
				return
			}
		}
	}
}

// checkChaosHistory checks guarantees 1 and 2 of docs/design.md over the
// grants: per name, distinct grants have distinct tokens; a grant that
// began after another was granted has a higher token; and no two holders
// believed they held the same lock at the same time (the faults here are
// of the network alone: no pause, failover or clock jump, under which
// guarantee 2 holds).
func checkChaosHistory(t *testing.T, h *chaosLog) {
	byName := map[string][]*chaosGrant{}
	for _, g := range h.grants {
		byName[g.name] = append(byName[g.name], g)
	}
	for name, gs := range byName {
		sort.Slice(gs, func(i, j int) bool { return gs[i].granted.Before(gs[j].granted) })
		tokens := map[fence.Token]*chaosGrant{}
		for _, g := range gs {
			if o, ok := tokens[g.token]; ok {
				t.Errorf("%s: token %d granted twice: to %s (lease %s) and %s (lease %s)", name, g.token, o.who, o.id, g.who, g.id)
			}
			tokens[g.token] = g
		}
		for _, a := range gs {
			for _, b := range gs {
				if a == b {
					continue
				}
				if a.granted.Before(b.invoked) && a.token >= b.token {
					t.Errorf("%s: %s was granted token %d at %s, and %s, asking after that (%s), got %d",
						name, a.who, a.token, a.granted.Format(chaosTime), b.who, b.invoked.Format(chaosTime), b.token)
				}
				if !a.first.IsZero() && !b.first.IsZero() && a.token < b.token &&
					!a.believed.Before(b.first) && !b.believed.Before(a.first) {
					t.Errorf("%s: two holders at once: %s (token %d) believed it held it until %s, %s (token %d) from %s",
						name, a.who, a.token, a.believed.Format(chaosTime), b.who, b.token, b.first.Format(chaosTime))
				}
			}
		}
	}
}

const chaosTime = "15:04:05.000000"
