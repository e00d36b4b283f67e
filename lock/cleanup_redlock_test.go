package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// cleanupNodeTimeout is the node timeout of these tests' Redlocks: longer
// than the cleanup's own bound (a second), so that a release waiting in a
// frozen node's proxy is bounded by that second, which the tests' checks
// right after the failed call returns are far within.
const cleanupNodeTimeout = 2 * time.Second

// redlockCleanup is a Redlock store on three redis-servers of its own,
// each behind a fault proxy that a test freezes (Hold) at a chosen step,
// each client counting the store's calls of the release script.
type redlockCleanup struct {
	store   *lock.RedlockStore
	proxies []*faultproxy.Proxy
	direct  []*redis.Client // straight to each Redis, for checks behind the store's back
	release []*scriptCalls
	seq     *freezingSequencer
	taken   *afterScript // node 0's acquire script
}

// afterScript is a go-redis hook that calls then once, when armed, after
// a call of one script (by its SHA) has its answer: the step after which
// a test freezes a node.
type afterScript struct {
	scriptCalls
	armed atomic.Bool
	then  func()
}

func (h *afterScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.count(cmd) > 0 && h.armed.CompareAndSwap(true, false) {
			h.then()
		}
		return err
	}
}

func (h *afterScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if h.count(c) > 0 && h.armed.CompareAndSwap(true, false) {
				h.then()
			}
		}
		return err
	}
}

func newRedlockCleanup(t *testing.T) *redlockCleanup {
	t.Helper()
	r := &redlockCleanup{}
	clients := make([]redis.UniversalClient, 3)
	for i := range clients {
		n := newProxiedNode(t)
		p, direct, calls, rdb := n.proxy, n.direct, n.release, n.rdb
		if i == 0 {
			r.taken = &afterScript{scriptCalls: scriptCalls{sha: scriptSHA(t, direct, "scripts/prelude.lua", "scripts/acquire.lua")}, then: func() { p.Hold(true) }}
			rdb.AddHook(r.taken)
		}
		if err := rdb.Ping(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		r.proxies, r.direct, r.release = append(r.proxies, p), append(r.direct, direct), append(r.release, calls)
		clients[i] = rdb
	}
	// After a token, nodes 0 and 1 freeze: a majority of the confirms fail.
	r.seq = &freezingSequencer{Sequencer: newSequencer(t), freeze: func() { r.proxies[0].Hold(true); r.proxies[1].Hold(true) }}
	s, err := lock.NewRedlockStore(clients, r.seq, lock.WithNodeTimeout(cleanupNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r.store = s
	warmUp(t, s) // fresh nodes set their epochs, a first token may take a while
	for _, c := range r.release {
		c.began.Store(0)
		c.ended.Store(0)
	}
	return r
}

// ended is how many release calls ended on the given nodes.
func (r *redlockCleanup) ended(nodes ...int) (n int64) {
	for _, i := range nodes {
		n += r.release[i].ended.Load()
	}
	return n
}

func (r *redlockCleanup) leaseOn(t *testing.T, node int, name string) string {
	t.Helper()
	id, err := r.direct[node].Get(t.Context(), "fenced:{"+name+"}:lease").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return id
}

// thawAndWaitFreed thaws every node and waits until no node has leaseID
// for name: long before its TTL (30 s), so a release did it.
func (r *redlockCleanup) thawAndWaitFreed(t *testing.T, name, leaseID string, frozen ...int) {
	t.Helper()
	for _, p := range r.proxies {
		p.Hold(false)
	}
	for i := range r.direct {
		testenv.WaitUntil(t, 5*time.Second, func() bool { return r.leaseOn(t, i, name) != leaseID })
	}
	testenv.WaitUntil(t, 5*time.Second, func() bool { return r.ended(frozen...) >= int64(len(frozen)) })
}

// holdElsewhere has another lease hold name on nodes 1 and 2, a majority:
// node 0 is free.
func (r *redlockCleanup) holdElsewhere(t *testing.T, name string) {
	t.Helper()
	for _, i := range []int{1, 2} {
		if err := r.direct[i].Set(t.Context(), "fenced:{"+name+"}:lease", "someone-else", 30*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// acquireMissingQuorum makes one acquisition of name, held by another on
// nodes 1 and 2, that takes node 0, which then freezes: the release of its
// lease there waits in the proxy. It returns the lease id.
func (r *redlockCleanup) acquireMissingQuorum(t *testing.T, name string) (string, time.Duration) {
	t.Helper()
	r.holdElsewhere(t, name)
	r.taken.armed.Store(true)
	id := newID(t)
	start := time.Now()
	g, err := r.store.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: id, TTL: 30 * time.Second})
	took := time.Since(start)
	var held *lock.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("an acquisition of a lock held on a majority: %+v, %v; want a *HeldError", g, err)
	}
	if r.taken.armed.Load() {
		t.Fatal("node 0 did not take the lease")
	}
	return id, took
}

// Defect 127: an acquisition that misses a quorum (here ordinary
// contention: another lease holds the lock on two nodes of three) frees
// the lease it took on the others; the store did that before the error
// returned, waiting for every node's answer, up to the node timeout (or a
// second) for a node that does not answer. The error now returns at once,
// while the release still waits in the frozen node's proxy, and the
// release is done once the node thaws.
func TestRedlockMissedQuorumDoesNotWaitForItsCleanup(t *testing.T) {
	t.Parallel()
	r := newRedlockCleanup(t)
	name := testenv.Name(t)
	id, took := r.acquireMissingQuorum(t, name)
	ended := r.ended(0)
	t.Logf("the acquisition that missed its quorum answered after %s; the abandon's release on the frozen node had begun %d, ended %d",
		took.Round(time.Millisecond), r.release[0].began.Load(), ended)
	if ended != 0 {
		t.Fatalf("the acquisition returned (after %s) only once the release of its lease on the frozen node had ended: it waited for its cleanup",
			took.Round(time.Millisecond))
	}
	if got := r.leaseOn(t, 0, name); got != id {
		t.Fatalf("while node 0 is frozen its lease is %q, want the abandoned %q still there", got, id)
	}
	r.thawAndWaitFreed(t, name, id, 0)
	if got := r.leaseOn(t, 1, name); got != "someone-else" {
		t.Fatalf("node 1's lease is %q after the abandon, want the other holder's", got)
	}
}

// acquireUnconfirmed makes one acquisition of name whose confirm meets
// nodes 0 and 1 frozen, and fails at its 500 ms deadline (ErrLost: too
// few confirmed). It returns the lease id and how long it took.
func (r *redlockCleanup) acquireUnconfirmed(t *testing.T, req lock.AcquireRequest) (string, time.Duration) {
	t.Helper()
	req.LeaseID, req.TTL = newID(t), 30*time.Second
	r.seq.armed.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	g, err := r.store.Acquire(ctx, req)
	took := time.Since(start)
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("an acquisition whose confirm met two frozen nodes of three: %+v, %v; want ErrLost", g, err)
	}
	return req.LeaseID, took
}

// Defect 127, after a token: the confirm fails on a majority (two nodes
// frozen, the caller's deadline reached), and the lease is freed again;
// the error returns without waiting for the frozen nodes' releases, which
// are done once they thaw.
func TestRedlockUnconfirmedDoesNotWaitForItsCleanup(t *testing.T) {
	t.Parallel()
	r := newRedlockCleanup(t)
	name := testenv.Name(t)
	id, took := r.acquireUnconfirmed(t, lock.AcquireRequest{Name: name})
	ended := r.ended(0, 1)
	t.Logf("the unconfirmed acquisition answered after %s (its deadline 500ms); the abandon's releases on the frozen nodes had ended %d",
		took.Round(time.Millisecond), ended)
	if ended != 0 {
		t.Fatalf("the acquisition returned (after %s) only once the releases of its lease on the frozen nodes had ended: it waited for its cleanup",
			took.Round(time.Millisecond))
	}
	r.thawAndWaitFreed(t, name, id, 0, 1)
}

// The release after a failed confirm of a remote acquisition (Rejoin)
// still comes before the error: the nodes that confirmed recorded the
// grant, which the acquisition's next request would be handed, and a
// release after that would free it under its holder.
func TestRedlockUnconfirmedRejoinReleasesFirst(t *testing.T) {
	t.Parallel()
	r := newRedlockCleanup(t)
	name := testenv.Name(t)
	id, took := r.acquireUnconfirmed(t, lock.AcquireRequest{Name: name, Rejoin: newID(t)})
	if ended := r.ended(0, 1, 2); ended != 3 {
		t.Fatalf("the acquisition returned (after %s) with %d of its 3 nodes' releases ended, want all: a Rejoin's release comes first",
			took.Round(time.Millisecond), ended)
	}
	if got := r.leaseOn(t, 2, name); got == id {
		t.Fatalf("the unfrozen node still has the abandoned lease %q when the acquisition returned", id)
	}
	for _, p := range r.proxies {
		p.Hold(false)
	}
}

// Close waits for the cleanups that failed acquisitions left running: once
// it returns, no goroutine of the store is left, though node 0 is still
// frozen and its release could not be done.
func TestRedlockCloseEndsTheCleanups(t *testing.T) {
	r := newRedlockCleanup(t)
	r.acquireMissingQuorum(t, testenv.Name(t))
	if err := r.store.Close(); err != nil {
		t.Fatal(err)
	}
	for i, c := range r.release {
		if b, e := c.began.Load(), c.ended.Load(); b != e {
			t.Fatalf("after Close, node %d's release calls begun %d, ended %d: Close left the cleanup running", i, b, e)
		}
	}
	// A goroutine that said it was done may still be on its way out: a
	// while, far less than the second the cleanup may wait.
	testenv.WaitGoroutinesInEnd(t, "fenced/lock.(*RedlockStore)", 200*time.Millisecond)
	r.proxies[0].Hold(false)
}
