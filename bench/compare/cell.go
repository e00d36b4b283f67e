package compare

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/fenced/fenced/internal/clock"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/sequencer"
)

const workers = 3

// cell is one scheme under one fault, on a setup of its own.
type cell struct {
	cfg    Config
	s      scheme
	f      fault
	exe    string
	dir    string
	pool   *pgxpool.Pool
	schema string
	lock   string
	ttl    time.Duration
	log    io.Writer

	primaries []*redisNode
	replicas  []*redisNode // failover: replicas of the first len(replicas) primaries
	members   []*etcdMember
	leaderIdx int
	// proxies[w][i]: worker w's (0-based) proxy of Redis node i, etcdProx of etcd member i.
	redisProx [][]*faultproxy.Proxy
	etcdProx  [][]*faultproxy.Proxy

	j      *journal
	ws     map[int]*workerProc // by worker id
	transN int
	rng    *rand.Rand
	notes  []string
	marks  map[string]int64 // phase times, ns
}

func (c *cell) note(format string, args ...any) {
	s := strings.Join(strings.Fields(fmt.Sprintf(format, args...)), " ")
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	c.notes = append(c.notes, s)
	fmt.Fprintf(c.log, "    %s %s: %s\n", c.s.ID, c.f.ID, s)
}

func (c *cell) mark(name string) { c.marks[name] = time.Now().UnixNano() }

// affected is how many Redis nodes a Redis fault hits: one, or a majority
// of Redlock's five.
func (c *cell) affected() int {
	if n := c.s.redisNodes(); n < 5 {
		return n
	}
	return 3
}

// setup starts the scenario's processes, proxies and ledger.
func (c *cell) setup(ctx context.Context) error {
	c.j = newJournal()
	c.ws = map[int]*workerProc{}
	c.marks = map[string]int64{}
	if err := createLedger(ctx, c.pool, c.schema); err != nil {
		return err
	}
	n := c.s.redisNodes()
	for i := range n {
		faketime := c.f.ID == FClockJump && i < c.affected()
		// A replica syncs at once, not after Redis's default 5 s wait for
		// more replicas.
		r, err := startRedis(ctx, filepath.Join(c.dir, fmt.Sprint("redis", i)), faketime, "--repl-diskless-sync-delay", "0")
		if err != nil {
			return err
		}
		c.primaries = append(c.primaries, r)
	}
	if c.f.ID == FFailover {
		for i := range c.affected() {
			p := c.primaries[i]
			r, err := startRedis(ctx, filepath.Join(c.dir, fmt.Sprint("replica", i)), false, "--replicaof", "127.0.0.1", fmt.Sprint(p.port))
			if err != nil {
				return err
			}
			c.replicas = append(c.replicas, r)
			if err := waitReplicaUp(ctx, r); err != nil {
				return err
			}
		}
	}
	if c.s.Etcd {
		members := 1
		if c.f.ID == FLeaderKill || c.f.ID == FLeaderFreeze {
			members = 3
		}
		var err error
		if c.members, err = startEtcd(ctx, c.exe, c.dir, members); err != nil {
			return err
		}
		if members > 1 {
			if c.leaderIdx, err = leader(ctx, c.members); err != nil {
				return err
			}
		}
	}
	for range workers {
		var rp, ep []*faultproxy.Proxy
		for _, r := range c.primaries {
			p, err := faultproxy.New(r.Addr)
			if err != nil {
				return err
			}
			rp = append(rp, p)
		}
		for _, m := range c.members {
			p, err := faultproxy.New(m.addr())
			if err != nil {
				return err
			}
			ep = append(ep, p)
		}
		c.redisProx = append(c.redisProx, rp)
		c.etcdProx = append(c.etcdProx, ep)
	}
	for w := 1; w <= workers; w++ {
		if _, err := c.startWorker(w, w); err != nil {
			return err
		}
	}
	return nil
}

func waitReplicaUp(ctx context.Context, r *redisNode) error {
	c := r.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica %s did not sync in 10s", r.Addr)
		}
		time.Sleep(10 * time.Millisecond) // polling the replication link
	}
}

// startWorker starts worker id with the proxies of slot (1 to 3).
func (c *cell) startWorker(id, slot int) (*workerProc, error) {
	cfg := workerConfig{ID: id, Scheme: c.s.ID, Lock: c.lock, Schema: c.schema, DSN: c.cfg.DSN, TTL: c.ttl,
		EtcdPrefix: "/fenced/", AcquireTimeout: 15 * time.Second}
	for _, p := range c.redisProx[slot-1] {
		cfg.Redis = append(cfg.Redis, p.Addr())
	}
	eps := c.etcdProx[slot-1]
	if len(eps) == 3 { // leader faults: worker 1 talks to the leader only, 2 and 3 to one follower each
		var followers []*faultproxy.Proxy
		for i, p := range eps {
			if i != c.leaderIdx {
				followers = append(followers, p)
			}
		}
		pin := map[int]*faultproxy.Proxy{1: eps[c.leaderIdx], 2: followers[0], 3: followers[1]}[slot]
		eps = []*faultproxy.Proxy{pin}
	}
	for _, p := range eps {
		cfg.Etcd = append(cfg.Etcd, p.Addr())
	}
	var verbose io.Writer
	if c.cfg.Verbose {
		verbose = c.log
	}
	w, err := startWorker(c.exe, cfg, c.j, verbose)
	if err != nil {
		return nil, err
	}
	c.ws[id] = w
	return w, nil
}

// teardown stops everything the cell started, whatever state it is in.
func (c *cell) teardown() {
	for _, w := range c.ws {
		w.stop(3 * time.Second)
	}
	for _, ps := range append(c.redisProx, c.etcdProx...) {
		for _, p := range ps {
			p.Close()
		}
	}
	for _, r := range append(c.primaries, c.replicas...) {
		r.p.kill()
	}
	for _, m := range c.members {
		m.p.kill()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = dropLedger(ctx, c.pool, c.schema)
	_ = os.RemoveAll(c.dir)
}

// transfer sends worker w a transfer; a conflicting one uses accounts 1
// and 2, which worker 1's held transfer reads.
func (c *cell) transfer(w int, from, to int, hold bool) (string, error) {
	c.transN++
	id := fmt.Sprintf("w%d-t%d", w, c.transN)
	if from == 0 {
		from = 1 + c.rng.IntN(accounts)
		to = 1 + (from+c.rng.IntN(accounts-1))%accounts
	}
	return id, c.ws[w].send(command{Op: opTransfer, Transfer: id, From: from, To: to, Amount: 1 + c.rng.Int64N(50), Hold: hold})
}

func (c *cell) goAhead(w int) error { return c.ws[w].send(command{Op: opGo}) }

// seen reports whether an event of worker w about transfer id matches.
func seen(w int, id, what string, ok func(event) bool) func([]event) bool {
	return func(es []event) bool {
		for _, e := range es {
			if e.Worker == w && e.Transfer == id && e.What == what && !e.Inv && (ok == nil || ok(e)) {
				return true
			}
		}
		return false
	}
}

func (c *cell) waitDone(ctx context.Context, w int, id string, timeout time.Duration) (bool, error) {
	return c.j.waitFor(ctx, timeout, seen(w, id, evDone, nil))
}

// waitAllDone waits until every transfer sent has been reported done.
func (c *cell) waitAllDone(ctx context.Context, timeout time.Duration) error {
	ok, err := c.j.waitFor(ctx, timeout, func(es []event) bool {
		done := map[int]int{}
		for _, e := range es {
			if e.What == evDone {
				done[e.Worker]++
			}
		}
		for id, w := range c.ws {
			if done[id] < w.sent {
				return false
			}
		}
		return true
	})
	if err == nil && !ok {
		err = fmt.Errorf("workers did not finish their transfers in %s", timeout)
	}
	return err
}

// load gives every live worker n transfers at once and waits for them.
func (c *cell) load(ctx context.Context, n int, ids ...int) error {
	for _, w := range ids {
		for range n {
			if _, err := c.transfer(w, 0, 0, false); err != nil {
				return err
			}
		}
	}
	return c.waitAllDone(ctx, time.Duration(n)*20*time.Second+20*time.Second)
}

// run is the scenario: warm-up, the fault, the aftermath.
func (c *cell) run(ctx context.Context) error {
	c.mark("warm")
	if err := c.load(ctx, c.cfg.Warm, 1, 2, 3); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	c.mark("warm-end")
	c.mark("fault")
	var err error
	switch c.f.ID {
	case FLatRedis, FLatEtcd:
		err = c.latency(ctx)
	case FRestoreNewest, FRestoreOther, FRestoreNew, FRestoreRaise:
		err = c.restore(ctx)
	case FPartEtcd:
		if c.s.Lease == leaseEtcd {
			err = c.holdFault(ctx)
		} else {
			err = c.tokenPartition(ctx)
		}
	default:
		err = c.holdFault(ctx)
	}
	if err != nil {
		return fmt.Errorf("fault: %w", err)
	}
	c.mark("fault-end")
	ids := slices.Sorted(maps.Keys(c.ws))
	if err := c.load(ctx, c.cfg.After, ids...); err != nil {
		return fmt.Errorf("after the fault: %w", err)
	}
	c.mark("end")
	return nil
}

// successorDeadline is how long a scenario waits for worker 2 to take a
// lock that worker 1 still believes it holds: past it, the lock excluded.
func (c *cell) successorDeadline() time.Duration {
	d := 3*c.ttl + 2*time.Second
	if c.f.ID == FLeaderKill || c.f.ID == FLeaderFreeze {
		d += 2 * time.Second // an election, and etcd renews every lease on the new leader
	}
	return d
}

// holdFault: worker 1 holds and has read; the fault; worker 2's
// conflicting transfer; worker 1 writes.
func (c *cell) holdFault(ctx context.Context) error {
	if c.f.ID == FFailover {
		for i, r := range c.replicas {
			if err := r.p.freeze(); err != nil {
				return err
			}
			pc := c.primaries[i].client()
			err := pc.ClientKillByFilter(ctx, "TYPE", "replica").Err()
			pc.Close()
			if err != nil {
				return fmt.Errorf("cut the replica's link: %w", err)
			}
		}
	}
	t1, err := c.transfer(1, 1, 2, true)
	if err != nil {
		return err
	}
	if ok, err := c.j.waitFor(ctx, 20*time.Second, seen(1, t1, evHeld, nil)); err != nil || !ok {
		return fmt.Errorf("worker 1 did not take the lock and read (%v)", err)
	}
	if err := c.inject(ctx); err != nil {
		return err
	}
	c.mark("inject")
	t2, err := c.transfer(2, 1, 2, false)
	if err != nil {
		return err
	}
	for range 2 {
		if _, err := c.transfer(3, 3, 4, false); err != nil {
			return err
		}
	}
	ok, err := c.successor(ctx, t2, c.successorDeadline())
	if err != nil {
		return err
	}
	if !ok {
		c.note("worker 2 did not get the lock within %s of the fault while worker 1 held it", c.successorDeadline().Round(100*time.Millisecond))
	}
	if c.f.ID == FPause {
		if err := c.ws[1].p.thaw(); err != nil {
			return err
		}
	}
	if err := c.goAhead(1); err != nil {
		return err
	}
	if done, err := c.waitDone(ctx, 1, t1, 20*time.Second); err != nil || !done {
		return fmt.Errorf("worker 1 did not finish its held transfer (%v)", err)
	}
	if err := c.heal(ctx); err != nil {
		return err
	}
	return c.waitAllDone(ctx, 40*time.Second)
}

// Where a transfer stands.
const (
	stTimeout = iota
	stReached // held, or granted: what was waited for
	stFailed  // done without reaching it: its acquisition failed
)

// until waits for worker w's transfer id to reach what (evHeld, or
// evAcquire granted), or to be done without it.
func (c *cell) until(ctx context.Context, w int, id, what string, timeout time.Duration) (int, string, error) {
	st, why := stTimeout, ""
	_, err := c.j.waitFor(ctx, timeout, func(es []event) bool {
		for _, e := range es {
			if e.Worker != w || e.Transfer != id || e.Inv {
				continue
			}
			switch {
			case e.What == what && (what != evAcquire || e.Outcome == outOK):
				st = stReached
				return true
			case e.What == evDone:
				st, why = stFailed, e.Err
				return true
			}
		}
		return false
	})
	return st, why, err
}

// successor waits until worker 2 has taken the lock and finished its
// conflicting transfer t2. A failed acquisition (a backend that errs
// during the fault) is tried again, with a new transfer, until timeout.
func (c *cell) successor(ctx context.Context, t2 string, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	failures, why := 0, ""
	for {
		st, w, err := c.until(ctx, 2, t2, evAcquire, time.Until(deadline))
		if err != nil {
			return false, err
		}
		if st == stFailed {
			why = w
		}
		switch st {
		case stReached:
			if failures > 0 {
				c.note("worker 2's acquisition failed %d time(s) during the fault (%s)", failures, why)
			}
			if done, err := c.waitDone(ctx, 2, t2, 20*time.Second); err != nil || !done {
				return false, fmt.Errorf("worker 2 took the lock but did not finish (%v)", err)
			}
			return true, nil
		case stFailed:
			failures++
			if time.Until(deadline) <= 0 {
				c.note("worker 2's acquisition failed %d time(s) during the fault (%s)", failures, why)
				return false, nil
			}
			if t2, err = c.transfer(2, 1, 2, false); err != nil {
				return false, err
			}
		default:
			if failures > 0 {
				c.note("worker 2's acquisition failed %d time(s) during the fault (%s)", failures, why)
			}
			return false, nil
		}
	}
}

// holdAgain waits until worker w holds for transfer id; a failed
// acquisition is tried again with a new held transfer. It returns the
// transfer that holds.
func (c *cell) holdAgain(ctx context.Context, w int, id string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, why, err := c.until(ctx, w, id, evHeld, time.Until(deadline))
		if err != nil {
			return id, err
		}
		switch st {
		case stReached:
			return id, nil
		case stFailed:
			c.note("worker %d's acquisition failed (%s); it tries again", w, why)
			if id, err = c.transfer(w, 1, 2, true); err != nil {
				return id, err
			}
		default:
			return id, fmt.Errorf("worker %d did not take the lock in %s", w, timeout)
		}
	}
}

// inject does the fault while worker 1 holds.
func (c *cell) inject(ctx context.Context) error {
	switch c.f.ID {
	case FPause:
		return c.ws[1].p.freeze()
	case FFailover:
		for i, r := range c.replicas {
			c.primaries[i].p.kill()
			if err := r.p.thaw(); err != nil {
				return err
			}
			rc := r.client()
			err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err()
			if err == nil {
				c.checkMissing(ctx, rc)
			}
			rc.Close()
			if err != nil {
				return fmt.Errorf("promote the replica: %w", err)
			}
			for w := range workers {
				c.redisProx[w][i].SetTarget(r.Addr)
				c.redisProx[w][i].CutAll()
			}
		}
	case FRestart:
		for i := range c.affected() {
			if err := c.primaries[i].restart(ctx); err != nil {
				return err
			}
			for w := range workers {
				c.redisProx[w][i].CutAll()
			}
		}
	case FClockJump:
		jump := 30 * time.Second
		for i := range c.affected() {
			if err := c.primaries[i].jump(jump); err != nil {
				return err
			}
		}
		// Check that the server's clock followed.
		rc := c.primaries[0].client()
		t, err := rc.Time(ctx).Result()
		rc.Close()
		if err != nil {
			return err
		}
		if d := time.Until(t); d < jump/2 {
			return fmt.Errorf("the clock jump did not take: Redis TIME is %s ahead", d)
		}
	case FLeaderKill:
		c.members[c.leaderIdx].p.kill()
	case FLeaderFreeze:
		return c.members[c.leaderIdx].p.freeze()
	case FPartRedis:
		for _, p := range c.redisProx[0] {
			p.Hold(true)
		}
	case FPartEtcd:
		for _, p := range c.etcdProx[0] {
			p.Hold(true)
		}
	}
	return nil
}

// lockKey is the scheme's lock key in Redis.
func (c *cell) lockKey() string {
	if c.s.Fenced {
		return "fenced:{" + c.lock + "}:lease"
	}
	return peerKey(c.lock)
}

// checkMissing notes whether the promoted replica has worker 1's lease
// after all: then the fault is not what it claims to be.
func (c *cell) checkMissing(ctx context.Context, rc *redis.Client) {
	if n, err := rc.Exists(ctx, c.lockKey()).Result(); err == nil && n > 0 {
		c.note("the promoted replica %s had the lease: the failover lost nothing", rc.Options().Addr)
	}
}

// heal undoes what the fault left after worker 1 wrote.
func (c *cell) heal(ctx context.Context) error {
	switch c.f.ID {
	case FLeaderKill:
		m := c.members[c.leaderIdx]
		if err := m.start(ctx, c.exe); err != nil {
			return fmt.Errorf("restart the killed member: %w", err)
		}
		for w := range workers {
			for _, p := range c.etcdProx[w] {
				p.CutAll()
			}
		}
	case FLeaderFreeze:
		return c.members[c.leaderIdx].p.thaw()
	case FPartRedis:
		for _, p := range c.redisProx[0] {
			p.Hold(false)
		}
	case FPartEtcd:
		for _, p := range c.etcdProx[0] {
			p.Hold(false)
		}
	}
	return nil
}

// tokenPartition: fenced with leases in Redis, worker 1 cut from etcd
// while it takes its token.
func (c *cell) tokenPartition(ctx context.Context) error {
	for _, p := range c.etcdProx[0] {
		p.Hold(true)
	}
	t1, err := c.transfer(1, 1, 2, true)
	if err != nil {
		return err
	}
	if ok, err := c.probeHeld(ctx, 5*time.Second, true); err != nil {
		return err
	} else if !ok {
		c.note("worker 1's lease never appeared in Redis")
	}
	c.mark("inject")
	t2, err := c.transfer(2, 1, 2, false)
	if err != nil {
		return err
	}
	ok, err := c.waitDone(ctx, 2, t2, c.successorDeadline()+10*time.Second)
	if err != nil {
		return err
	}
	if !ok {
		c.note("worker 2 did not finish while worker 1 was cut from etcd")
	}
	for _, p := range c.etcdProx[0] {
		p.Hold(false)
	}
	if _, err := c.holdAgain(ctx, 1, t1, 30*time.Second); err != nil {
		return fmt.Errorf("after the partition healed: %w", err)
	}
	if err := c.goAhead(1); err != nil {
		return err
	}
	return c.waitAllDone(ctx, 40*time.Second)
}

// latency: worker 1's acquisition is slower than the TTL.
func (c *cell) latency(ctx context.Context) error {
	lat := 3 * c.ttl / 2
	prox := c.redisProx[0]
	if c.f.ID == FLatEtcd {
		prox = c.etcdProx[0]
	}
	set := func(d time.Duration) {
		for _, p := range prox {
			p.SetLatency(d)
		}
	}
	set(lat)
	start := time.Now()
	t1, err := c.transfer(1, 1, 2, true)
	if err != nil {
		return err
	}
	landed, err := c.probeHeld(ctx, 3*lat+c.ttl, true)
	if err != nil {
		return err
	}
	if !landed {
		c.note("worker 1's lease never showed in the store within %s", (3*lat + c.ttl).Round(100*time.Millisecond))
	}
	c.mark("inject")
	t2, err := c.transfer(2, 1, 2, true)
	if err != nil {
		return err
	}
	st2, _, err := c.until(ctx, 2, t2, evHeld, lat+3*c.ttl+time.Second)
	if err != nil {
		return err
	}
	w2held := st2 == stReached
	st1, why, err := c.until(ctx, 1, t1, evHeld, time.Until(start.Add(2*lat+2*c.ttl+time.Second)))
	if err != nil {
		return err
	}
	w1held := st1 == stReached
	if st1 == stFailed {
		c.note("worker 1's acquisition failed under the latency (%s)", why)
	}
	if w2held && w1held {
		c.note("both workers held the lock and had read at once")
	}
	if w2held {
		if err := c.goAhead(2); err != nil {
			return err
		}
		if ok, err := c.waitDone(ctx, 2, t2, 20*time.Second); err != nil || !ok {
			return fmt.Errorf("worker 2 did not finish (%v)", err)
		}
	}
	set(0)
	if !w1held {
		if st1 == stFailed {
			if t1, err = c.transfer(1, 1, 2, true); err != nil {
				return err
			}
		}
		if t1, err = c.holdAgain(ctx, 1, t1, 30*time.Second); err != nil {
			return err
		}
	}
	if err := c.goAhead(1); err != nil {
		return err
	}
	if ok, err := c.waitDone(ctx, 1, t1, 20*time.Second); err != nil || !ok {
		return fmt.Errorf("worker 1 did not finish (%v)", err)
	}
	if !w2held {
		if st2 == stFailed {
			if t2, err = c.transfer(2, 1, 2, true); err != nil {
				return err
			}
		}
		if _, err = c.holdAgain(ctx, 2, t2, 30*time.Second); err != nil {
			return err
		}
		if err := c.goAhead(2); err != nil {
			return err
		}
	}
	return c.waitAllDone(ctx, 40*time.Second)
}

// probeHeld polls the lock's store directly (not through any proxy) until
// the lock is held (want true) or free.
func (c *cell) probeHeld(ctx context.Context, timeout time.Duration, want bool) (bool, error) {
	deadline := time.Now().Add(timeout)
	var rcs []*redis.Client
	for _, r := range c.primaries {
		rcs = append(rcs, r.client())
	}
	defer func() {
		for _, r := range rcs {
			r.Close()
		}
	}()
	var ec *clientv3.Client
	if c.s.Lease == leaseEtcd {
		var err error
		if ec, err = etcdClient(c.members...); err != nil {
			return false, err
		}
		defer ec.Close()
	}
	for time.Now().Before(deadline) {
		held := false
		switch c.s.Lease {
		case leaseRedis, leaseRedis5:
			key := c.lockKey()
			n := 0
			for _, r := range rcs {
				if v, err := r.Exists(ctx, key).Result(); err == nil && v == 1 {
					n++
				}
			}
			held = n > len(rcs)/2
		case leaseEtcd:
			prefix := etcdMutexPrefix(c.lock)
			if c.s.Fenced {
				prefix = sequencer.NewKeyspace("/fenced/").LockKey(c.lock)
			}
			if r, err := ec.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil && r.Count > 0 {
				held = true
			}
		}
		if held == want {
			return true, nil
		}
		if !clock.Sleep(ctx, 5*time.Millisecond) { // polling the store
			return false, ctx.Err()
		}
	}
	return false, nil
}

// restore: etcd goes back to an older snapshot while worker 1, a holder
// with a newer token, is frozen.
func (c *cell) restore(ctx context.Context) error {
	m := c.members[0]
	cli, err := etcdClient(m)
	if err != nil {
		return err
	}
	snap := filepath.Join(c.dir, "snap.db")
	lg := zap.NewNop()
	_, err = snapshot.NewV3(lg).Save(ctx, clientv3.Config{Endpoints: []string{m.ClientURL()}, Logger: lg}, snap)
	cli.Close()
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	// Tokens newer than the snapshot: worker 3's, then worker 1's.
	for range 3 {
		id, err := c.transfer(3, 3, 4, false)
		if err != nil {
			return err
		}
		if ok, err := c.waitDone(ctx, 3, id, 20*time.Second); err != nil || !ok {
			return fmt.Errorf("worker 3 after the snapshot (%v)", err)
		}
	}
	t1, err := c.transfer(1, 1, 2, true)
	if err != nil {
		return err
	}
	if ok, err := c.j.waitFor(ctx, 20*time.Second, seen(1, t1, evHeld, nil)); err != nil || !ok {
		return fmt.Errorf("worker 1 did not take the lock and read (%v)", err)
	}
	if err := c.ws[1].p.freeze(); err != nil {
		return err
	}
	fresh := c.f.ID == FRestoreNew || c.f.ID == FRestoreRaise
	if fresh {
		for _, id := range []int{2, 3} {
			c.ws[id].stop(3 * time.Second)
			delete(c.ws, id)
		}
	}
	c.mark("inject")
	m.p.kill()
	restored := filepath.Join(c.dir, "restored")
	if err := snapshot.NewV3(lg).Restore(snapshot.RestoreConfig{
		SnapshotPath: snap, Name: m.cfg.Name, OutputDataDir: restored,
		PeerURLs: []string{m.cfg.PeerURL}, InitialCluster: m.cfg.Name + "=" + m.cfg.PeerURL, InitialClusterToken: "fenced",
	}); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	m.cfg.Dir = restored
	m.cfg.InitialCluster = ""
	if err := m.start(ctx, c.exe); err != nil {
		return fmt.Errorf("start the restored member: %w", err)
	}
	for w := range workers {
		for _, p := range c.etcdProx[w] {
			p.CutAll()
		}
	}
	if c.f.ID == FRestoreRaise {
		cli, err := etcdClient(m)
		if err != nil {
			return err
		}
		f, err := sequencer.RaiseFloor(ctx, cli, "/fenced/", 0)
		cli.Close()
		if err != nil {
			return fmt.Errorf("raise-floor: %w", err)
		}
		c.note("raise-floor: the next token is at least %d", f.Next)
	}
	first, second := 2, 3
	if fresh {
		first, second = 4, 5
		if _, err := c.startWorker(4, 2); err != nil {
			return err
		}
		if _, err := c.startWorker(5, 3); err != nil {
			return err
		}
	} else if c.f.ID == FRestoreNewest {
		first, second = 3, 2
	}
	// The first acquirer works until one of its writes is admitted (its
	// tokens climb one revision or more per grant), then the second.
	for i := range 12 {
		id, err := c.transfer(first, 1, 2, false)
		if err != nil {
			return err
		}
		if ok, err := c.waitDone(ctx, first, id, 30*time.Second); err != nil || !ok {
			return fmt.Errorf("worker %d after the restore (%v)", first, err)
		}
		if c.applied(first, id) {
			if i > 0 {
				c.note("worker %d's first %d transfer(s) after the restore were rejected", first, i)
			}
			break
		}
	}
	// The frozen holder writes now: a repeated token admitted above lets
	// its stale write through.
	if err := c.ws[1].p.thaw(); err != nil {
		return err
	}
	if err := c.goAhead(1); err != nil {
		return err
	}
	if ok, err := c.waitDone(ctx, 1, t1, 20*time.Second); err != nil || !ok {
		return fmt.Errorf("worker 1 did not finish its held transfer (%v)", err)
	}
	if _, err := c.transfer(second, 3, 4, false); err != nil {
		return err
	}
	return c.waitAllDone(ctx, 40*time.Second)
}

// applied reports whether the transfer's write was admitted.
func (c *cell) applied(w int, id string) bool {
	ok, _ := c.j.waitFor(context.Background(), 0, seen(w, id, evWrite, func(e event) bool { return e.Outcome == outAdmitted }))
	return ok
}
