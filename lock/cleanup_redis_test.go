package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

// frozenAfterToken is a Redis lease store whose Redis, behind a fault
// proxy, freezes (Hold) once the sequencer handed out a token: the
// confirm, and the release that abandons the lease after it, wait in the
// proxy until thaw.
type frozenAfterToken struct {
	store   *lock.RedisStore
	proxy   *faultproxy.Proxy
	direct  *redis.Client // straight to Redis, for checks behind the store's back
	prefix  string
	release *scriptCalls // the store's calls of the release script
}

// freezingSequencer freezes the proxy after its next token, once armed.
type freezingSequencer struct {
	sequencer.Sequencer
	armed  atomic.Bool
	freeze func()
}

func (f *freezingSequencer) Next(ctx context.Context, name string) (fence.Token, error) {
	tok, err := f.Sequencer.Next(ctx, name)
	if f.armed.CompareAndSwap(true, false) {
		f.freeze()
	}
	return tok, err
}

// scriptCalls is a go-redis hook that counts the calls of one script (by
// its SHA, EVALSHA) that began and that ended, lone or in a pipeline.
type scriptCalls struct {
	sha          string
	began, ended atomic.Int64
}

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n := h.count(cmd)
		h.began.Add(n)
		defer h.ended.Add(n)
		return next(ctx, cmd)
	}
}

func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var n int64
		for _, c := range cmds {
			n += h.count(c)
		}
		h.began.Add(n)
		defer h.ended.Add(n)
		return next(ctx, cmds)
	}
}

func (h *scriptCalls) count(cmd redis.Cmder) int64 {
	if a := cmd.Args(); len(a) > 1 && strings.EqualFold(cmd.Name(), "evalsha") && a[1] == h.sha {
		return 1
	}
	return 0
}

// proxiedNode is a redis-server of the test's own behind a fault proxy:
// rdb goes through the proxy and counts the release script's calls in
// release; direct goes straight to the server.
type proxiedNode struct {
	proxy       *faultproxy.Proxy
	rdb, direct *redis.Client
	release     *scriptCalls
}

func newProxiedNode(t *testing.T) proxiedNode {
	t.Helper()
	r := testenv.StartRedis(t)
	p, err := faultproxy.New(r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	n := proxiedNode{proxy: p, direct: r.Client()}
	n.release = &scriptCalls{sha: scriptSHA(t, n.direct, "scripts/prelude.lua", "scripts/release.lua")}
	n.rdb = redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	n.rdb.AddHook(n.release)
	t.Cleanup(func() { n.rdb.Close() })
	return n
}

func newFrozenAfterToken(t *testing.T) (*frozenAfterToken, *freezingSequencer) {
	t.Helper()
	n := newProxiedNode(t)
	p, direct, release, rdb := n.proxy, n.direct, n.release, n.rdb
	seq := &freezingSequencer{Sequencer: newSequencer(t), freeze: func() { p.Hold(true) }}
	prefix := testenv.Name(t) + ":"
	s, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	warmUp(t, s) // a first token may take a while (the sequencer's floor)
	release.began.Store(0)
	release.ended.Store(0)
	seq.armed.Store(true)
	return &frozenAfterToken{store: s, proxy: p, direct: direct, prefix: prefix, release: release}, seq
}

// warmUp takes and releases a lock in s, so that what a fresh store does
// once (a first token, epochs) is done before a test times anything.
//
// The first calls may miss a short node timeout (Redlock's 50 ms) while
// connections are dialled and scripts loaded on a loaded machine: they are
// what warming up is for, so it tries again until one answers. Its lease
// is short: a Redlock node that answered none of a first attempt refuses
// leases until every lease it may have forgotten is over (defect 103),
// the attempt's TTL and more — with 10 s, longer than the warm-up waits.
func warmUp(t *testing.T, s lock.LeaseStore) {
	t.Helper()
	ctx := t.Context()
	var g lock.Grant
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		var err error
		g, err = s.Acquire(ctx, lock.AcquireRequest{Name: "warm-up", LeaseID: newID(t), TTL: 2 * time.Second})
		if err != nil {
			t.Logf("warming up: %v", err)
		}
		return err == nil
	})
	if err := s.Release(ctx, "warm-up", g.LeaseID, ""); err != nil {
		t.Fatal(err)
	}
}

func newID(t *testing.T) string {
	t.Helper()
	id, err := lock.NewReleaseID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// acquireFrozen makes one acquisition of name whose confirm meets the
// frozen Redis and fails at its 500 ms deadline, and returns its lease id
// and how long it took.
func (f *frozenAfterToken) acquireFrozen(t *testing.T, name string) (string, time.Duration) {
	t.Helper()
	id := newID(t)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	g, err := f.store.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: id, TTL: 30 * time.Second})
	took := time.Since(start)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an acquisition whose confirm met a frozen Redis: %+v, %v; want the deadline's error", g, err)
	}
	return id, took
}

func (f *frozenAfterToken) leaseOf(t *testing.T, name string) string {
	t.Helper()
	id, err := f.direct.Get(t.Context(), f.prefix+"{"+name+"}:lease").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return id
}

// Defect 126: an acquisition whose token could not be confirmed (Redis
// frozen, the caller's deadline reached) frees its lease again, so that
// others need not wait for its TTL; the store did that before the error
// returned, with up to a second of its own, so that the caller got its
// error (the server its 503) up to a second after its deadline. The
// error now returns at the deadline, while the release still waits in
// the frozen Redis's proxy, and the release is done once Redis thaws.
func TestFailedAcquireDoesNotWaitForItsCleanup(t *testing.T) {
	t.Parallel()
	f, _ := newFrozenAfterToken(t)
	name := testenv.Name(t)
	id, took := f.acquireFrozen(t, name)
	began, ended := f.release.began.Load(), f.release.ended.Load()
	t.Logf("the failed acquisition answered after %s (its deadline 500ms); the abandon's release had begun %d, ended %d",
		took.Round(time.Millisecond), began, ended)
	if ended != 0 {
		t.Fatalf("the failed acquisition returned (after %s) only once the release of its lease had ended: it waited for its cleanup",
			took.Round(time.Millisecond))
	}
	if got := f.leaseOf(t, name); got != id {
		t.Fatalf("while Redis is frozen the lease is %q, want the abandoned %q still there", got, id)
	}
	f.proxy.Hold(false)
	// The lease's TTL is 30 s: gone sooner, the release did it.
	testenv.WaitUntil(t, 5*time.Second, func() bool { return f.leaseOf(t, name) == "" })
	testenv.WaitUntil(t, 5*time.Second, func() bool { return f.release.ended.Load() >= 1 })
}

// Close waits for the cleanups that failed calls left running: once it
// returns, no goroutine of the store is left, though Redis is still frozen
// and the release could not be done.
func TestRedisCloseEndsTheCleanups(t *testing.T) {
	f, _ := newFrozenAfterToken(t)
	name := testenv.Name(t)
	f.acquireFrozen(t, name)
	if err := f.store.Close(); err != nil {
		t.Fatal(err)
	}
	if b, e := f.release.began.Load(), f.release.ended.Load(); b != e {
		t.Fatalf("after Close, release calls begun %d, ended %d: Close left the cleanup running", b, e)
	}
	// A goroutine that said it was done may still be on its way out: a
	// while, far less than the second the cleanup may wait.
	testenv.WaitGoroutinesInEnd(t, "fenced/lock.(*RedisStore)", 200*time.Millisecond)
	f.proxy.Hold(false)
}
