package lock_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// A Redlock node that comes back with some of its data, an RDB snapshot
// (an AOF fsynced every second, a replica that lagged), has its epoch,
// written long before, but not the latest leases. It voted at once: a
// lease held on a bare majority with it went to a second holder while the
// first still held it. The epoch now names the server process that set it
// (its run_id), and one of another process makes the node wait as if it
// had come back empty (docs/design.md, defects 103 and 178).

// TestRedlockNodeRestartedFromAnOldSnapshotSitsOut: node 0 snapshots, then
// the holder takes the lock on nodes 0 and 1 (node 2 busy), and node 0
// is killed and restarts from the snapshot: epoch, no lease. No second
// holder while the first's lease is valid; node 0 answers RecoveringError
// until that lease is over.
func TestRedlockNodeRestartedFromAnOldSnapshotSitsOut(t *testing.T) {
	t.Parallel()
	procs, s := startRedlock(t)
	warmUp(t, s) // every node sets its epoch
	ctx := t.Context()
	if err := procs[0].Client().Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	a, b := newClient(t, s), newClient(t, s)
	name := testenv.Name(t)
	leaseKey := "fenced:{" + name + "}:lease"
	const ttl = 5 * time.Second
	held := acquireBeside(t, a, procs[2].Client(), name, ttl)
	if err := procs[0].Restart(); err != nil { // SIGKILL, then the same dir
		t.Fatal(err)
	}
	if n, err := procs[0].Client().Exists(ctx, "fenced:epoch", leaseKey).Result(); err != nil || n != 1 {
		t.Fatalf("the restarted node has %d of its epoch and the lease (%v): want the epoch alone, from the snapshot", n, err)
	}
	sitsOut(t, procs[0].Client(), procs[0].Addr, held, func() { secondAcquire(t, b, name, held) })
	next, err := b.Acquire(ctx, name, ttl, lock.WithWait(3*ttl))
	if err != nil {
		t.Fatalf("once the holder's lease is over: %v", err)
	}
	if next.Token() <= held.Token() {
		t.Fatalf("token %d after %d", next.Token(), held.Token())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockNodeFailedOverToALaggingReplicaSitsOut: as above with a
// failover. Node 0 is a master whose replica follows it through a link the
// test holds, so that it has the epoch but not the holder's lease; the
// master dies, the replica is promoted (REPLICAOF NO ONE) and the node's
// address leads to it, as Sentinel's answer would. The replica's run_id is
// its own, not the master's that the epoch names.
func TestRedlockNodeFailedOverToALaggingReplicaSitsOut(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	master := testenv.StartRedis(t)
	link, err := faultproxy.New(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	replica := testenv.StartRedis(t)
	lhost, lport, _ := strings.Cut(link.Addr(), ":")
	if err := replica.Client().ReplicaOf(ctx, lhost, lport).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	px, err := faultproxy.New(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	node0 := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { node0.Close() })
	others := []*testenv.RedisProc{testenv.StartRedis(t), testenv.StartRedis(t)}
	clients := []redis.UniversalClient{node0, others[0].Client(), others[1].Client()}
	for _, c := range clients {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := lock.NewRedlockStore(clients, newSequencer(t), lock.WithNodeTimeout(testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	warmUp(t, s)
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		n, _ := replica.Client().Exists(ctx, "fenced:epoch").Result()
		return n == 1
	})
	link.Hold(true) // replication lags from here on

	a, b := newClient(t, s), newClient(t, s)
	name := testenv.Name(t)
	leaseKey := "fenced:{" + name + "}:lease"
	held := acquireBeside(t, a, others[1].Client(), name, 5*time.Second)
	master.Kill()
	link.Close() // what the replica had not received is lost with the master
	if err := replica.Client().ReplicaOf(ctx, "no", "one").Err(); err != nil {
		t.Fatal(err)
	}
	px.SetTarget(replica.Addr)
	px.CutAll()
	if n, err := replica.Client().Exists(ctx, "fenced:epoch", leaseKey).Result(); err != nil || n != 1 {
		t.Fatalf("the promoted replica has %d of the epoch and the lease (%v): want the epoch alone", n, err)
	}
	sitsOut(t, replica.Client(), px.Addr(), held, func() { secondAcquire(t, b, name, held) })
}

// TestRedlockNodeRestartedWithAnUpToDateSnapshotWaits: a snapshot taken
// after the grant has the lease, yet the node waits all the same: nothing
// tells an up-to-date snapshot from one that missed the last writes.
func TestRedlockNodeRestartedWithAnUpToDateSnapshotWaits(t *testing.T) {
	t.Parallel()
	procs, s := startRedlock(t)
	warmUp(t, s)
	ctx := t.Context()
	c := newClient(t, s)
	name := testenv.Name(t)
	const ttl = 3 * time.Second
	held, err := c.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := procs[0].Client().Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := procs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	if n, err := procs[0].Client().Exists(ctx, "fenced:epoch", "fenced:{"+name+"}:lease").Result(); err != nil || n != 2 {
		t.Fatalf("the restarted node has %d of its epoch and the lease (%v): want both, from the snapshot", n, err)
	}
	// Any acquisition that reaches the node finds the epoch not its own
	// and starts its wait.
	sitsOut(t, procs[0].Client(), procs[0].Addr, held, func() {
		if time.Now().After(held.Deadline()) {
			t.Fatal("the holder's lease is over and the node never started its wait")
		}
		if _, err := c.TryAcquire(ctx, name, ttl); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("the held lock: %v, want ErrNotAcquired", err)
		}
	})
	if err := held.Release(ctx); err != nil && !errors.Is(err, lock.ErrLost) {
		t.Fatal(err)
	}
}

// TestRedlockEpochWithoutRunIDRecoversOnce: an epoch as fenced wrote it
// before it named a run_id ("<ms>") is taken for one of another process:
// the node waits out the others' horizons once, sets an epoch of its own,
// and votes from then on with that epoch unchanged.
func TestRedlockEpochWithoutRunIDRecoversOnce(t *testing.T) {
	t.Parallel()
	procs, s := startRedlock(t)
	warmUp(t, s)
	ctx := t.Context()
	c := newClient(t, s)
	held, err := c.TryAcquire(ctx, testenv.Name(t), 2*time.Second) // horizons on every node
	if err != nil {
		t.Fatal(err)
	}
	node := procs[0].Client()
	if err := node.Set(ctx, "fenced:epoch", time.Now().Add(-time.Minute).UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Granted on nodes 1 and 2 (and 0 had it voted); node 0 starts its wait.
	sitsOut(t, node, procs[0].Addr, held, func() {
		other, err := c.TryAcquire(ctx, testenv.Name(t), time.Second)
		if err != nil {
			t.Logf("nodes 1 and 2 did not both answer: %v", err)
			return
		}
		if err := other.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	epoch := ownEpoch(t, node)
	again, err := c.TryAcquire(ctx, testenv.Name(t), time.Second)
	if err != nil {
		t.Fatalf("after the wait: %v", err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if now, err := node.Get(ctx, "fenced:epoch").Result(); err != nil || now != epoch {
		t.Fatalf("the epoch after the node voted again: %q (%v), want %q unchanged", now, err, epoch)
	}
}

// TestRedlockRestoredNodeExtendsNoLeaseReleasedSince: a refresh on a node
// restored from a snapshot is refused until the node votes again. The
// holder took the lock on nodes 0 and 2 (node 1 busy), node 0 snapshotted,
// an operator force-released the lock while node 2 did not answer, and a
// second holder took nodes 0 and 1. Node 0 then restarted from the
// snapshot, with the first holder's lease: that holder's refresh found it
// on nodes 0 and 2, a majority, and both held the lock at once.
func TestRedlockRestoredNodeExtendsNoLeaseReleasedSince(t *testing.T) {
	t.Parallel()
	procs, proxies, s := startProxiedRedlock(t, nil)
	warmUp(t, s)
	ctx := t.Context()
	a, b := newClient(t, s), newClient(t, s)
	name := testenv.Name(t)
	leaseKey := "fenced:{" + name + "}:lease"
	const ttl = 10 * time.Second
	first := acquireBeside(t, a, procs[1].Client(), name, ttl)
	if err := procs[0].Client().Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	proxies[2].Refuse(true)
	proxies[2].CutAll()
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		_, err := a.ForceRelease(ctx, name)
		var q *lock.QuorumError
		if errors.As(err, &q) {
			t.Logf("nodes 0 and 1 did not both answer: %v", err)
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})
	proxies[2].Refuse(false)
	next, err := b.Acquire(ctx, name, ttl, lock.WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("after the force-release: %v", err)
	}
	t.Cleanup(func() { next.Release(context.Background()) })
	if err := procs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	if n, err := procs[0].Client().Exists(ctx, leaseKey).Result(); err != nil || n != 1 {
		t.Fatalf("the restarted node has %d of the first holder's lease (%v): want it, from the snapshot", n, err)
	}
	// A node that misses the node timeout (its connection to the killed
	// process broken) leaves the refresh undecided: it is sent again.
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		err := first.Refresh(ctx, 0)
		var q *lock.QuorumError
		switch {
		case err == nil && next.Err() == nil && time.Now().Before(next.Deadline()):
			t.Fatalf("two holders at once: the first (token %d) refreshed its lease, the second (token %d) holds it for %s more",
				first.Token(), next.Token(), time.Until(next.Deadline()).Round(time.Millisecond))
		case errors.As(err, &q) && !errors.Is(err, lock.ErrLost):
			t.Logf("undecided: %v", err)
			return false
		case !errors.Is(err, lock.ErrLost):
			t.Fatalf("the refresh of a force-released lease: %v, want ErrLost", err)
		}
		return true
	})
}

// acquireBeside takes name's lock on the nodes other than busy, which
// holds a lease of someone else's meanwhile: a lease on a bare majority.
// With a wait, so that a node missing the node timeout on a loaded machine
// is asked again.
func acquireBeside(t *testing.T, c *lock.Client, busy *redis.Client, name string, ttl time.Duration, opts ...lock.Option) *lock.Lease {
	t.Helper()
	leaseKey := "fenced:{" + name + "}:lease"
	if err := busy.Set(t.Context(), leaseKey, "someone-else", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	held, err := c.Acquire(t.Context(), name, ttl, append(opts, lock.WithWait(5*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := busy.Del(t.Context(), leaseKey).Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

// sitsOut checks that node (at addr) waits before it votes again: attempt
// runs until the node's epoch is its own (untilSitsOut), the node alone
// answers a RecoveringError with a wait, and it votes again once held's
// lease is over.
func sitsOut(t *testing.T, node *redis.Client, addr string, held *lock.Lease, attempt func()) {
	t.Helper()
	untilSitsOut(t, node, attempt)
	probe := newNodeProbe(t, addr)
	if re := probe.answer(); re == nil || re.Wait <= 0 {
		t.Fatalf("the node while the holder's lease is valid: %v, want a RecoveringError with a wait", re)
	}
	probe.waitVotes(held.Deadline())
}

// untilSitsOut runs attempt, an acquisition, until node's epoch is one
// of its own, which the recovery an acquisition reaching it starts sets
// (the first may miss the node: its connection to a killed process is
// broken), and fails the test if that takes more than 10 s.
func untilSitsOut(t *testing.T, node *redis.Client, attempt func()) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(10 * time.Second)
	for attempt(); ownEpoch(t, node) == ""; attempt() {
		if time.Now().After(end) {
			epoch, err := node.Get(t.Context(), "fenced:epoch").Result()
			t.Fatalf("the node never started its wait: its epoch is %q (%v), not \"<ms> <its run_id>\"", epoch, err)
		}
		<-tick.C
	}
}

// ownEpoch returns node's epoch if it names the node's own server process
// ("<ms> <run_id>", recover.lua), else "".
func ownEpoch(t *testing.T, node *redis.Client) string {
	t.Helper()
	epoch, err := node.Get(t.Context(), "fenced:epoch").Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := node.Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	run := regexp.MustCompile(`run_id:([0-9a-f]+)`).FindStringSubmatch(info)
	if run == nil {
		t.Fatalf("no run_id in INFO server: %q", info)
	}
	if !regexp.MustCompile(`^[0-9]+ ` + run[1] + `$`).MatchString(epoch) {
		return ""
	}
	return epoch
}

// secondAcquire asks for the lock that held holds and fails the test if
// it is granted while held's lease is valid.
func secondAcquire(t *testing.T, c *lock.Client, name string, held *lock.Lease) {
	t.Helper()
	second, err := c.TryAcquire(t.Context(), name, held.TTL())
	if err == nil {
		defer second.Release(t.Context())
		if held.Err() == nil && time.Now().Before(held.Deadline()) {
			t.Fatalf("two holders at once after one node of three came back without the lease: first token %d (deadline in %s), second token %d",
				held.Token(), time.Until(held.Deadline()).Round(time.Millisecond), second.Token())
		}
		return // the first lease was over: a machine too slow to test this
	}
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second acquisition: %v, want ErrNotAcquired", err)
	}
}

// nodeProbe asks one Redlock node alone whether it votes: a Redlock of
// that node and two that refuse every connection, whose acquisitions fail
// with what the node answered.
type nodeProbe struct {
	t *testing.T
	s *lock.RedlockStore
}

func newNodeProbe(t *testing.T, addr string) *nodeProbe {
	t.Helper()
	clients := []redis.UniversalClient{redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})}
	for range 2 {
		p, err := faultproxy.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		p.Refuse(true)
		clients = append(clients, redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1}))
	}
	for _, c := range clients {
		t.Cleanup(func() { c.Close() })
	}
	s, err := lock.NewRedlockStore(clients, noTokens{}, lock.WithNodeTimeout(testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &nodeProbe{t: t, s: s}
}

// answer returns the node's RecoveringError, or nil when it votes (it
// took the probe's lease). A node that does not answer in the node
// timeout is asked again.
func (p *nodeProbe) answer() *lock.RecoveringError {
	p.t.Helper()
	var re *lock.RecoveringError
	testenv.WaitUntil(p.t, 30*time.Second, func() bool {
		_, err := p.s.Acquire(p.t.Context(), lock.AcquireRequest{Name: "probe-" + testenv.Name(p.t), LeaseID: newID(p.t), TTL: time.Second})
		var qe *lock.QuorumError
		switch {
		case errors.As(err, &re):
			return true
		case errors.As(err, &qe) && qe.OK == 1:
			re = nil
			return true
		case errors.As(err, &qe) && qe.OK == 0 && len(qe.Nodes) == 3:
			p.t.Logf("the node did not answer: %v", err)
			return false
		}
		p.t.Fatalf("probe: %v, want a RecoveringError or the node alone taking the lease", err)
		return false
	})
	return re
}

// waitVotes asks the node every 20 ms until it votes, and fails the test
// if it does before notBefore, the end of a lease it may have forgotten,
// or not within 30 s.
func (p *nodeProbe) waitVotes(notBefore time.Time) {
	p.t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(30 * time.Second)
	for {
		asked := time.Now() // it voted after this
		if p.answer() == nil {
			if asked.Before(notBefore) {
				p.t.Fatalf("the node voted when asked at %s, before %s, the end of a lease it may have forgotten",
					asked.Format(time.StampMicro), notBefore.Format(time.StampMicro))
			}
			return
		}
		if asked.After(end) {
			p.t.Fatal("the node still sits out after 30 s")
		}
		<-tick.C
	}
}

// noTokens is the probe's sequencer: its acquisitions never reach a
// majority, so never take a token.
type noTokens struct{}

func (noTokens) Next(context.Context, string) (fence.Token, error) {
	return 0, errors.New("the probe takes no token")
}
