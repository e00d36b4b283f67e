package lock_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// A Redis Cluster master that hangs (SIGSTOP here; a stuck disk, a kernel
// pause) holds the script calls of the locks in its slots until their
// callers' deadlines. It must hold nothing else: with eight acquisitions
// waiting on its locks, the first four sent one after another (each a
// lone call, in a slot of the store's group commit of its own: all four
// slots), a lock on a healthy master kept alive with a 1 s TTL must stay
// held for three TTLs, and another client must take and release a lock on
// a healthy master meanwhile, 20 times. Before, the four held calls kept
// every slot and the lock's refresh waited behind them until its lease
// was lost, about 1 s after the freeze (docs/design.md, defect 171).
// The controls, the waiters without the freeze and the freeze
// without the waiters, keep the lock before the mend too.
func TestRedisClusterFrozenMasterHoldsOnlyItsOwnLocks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		freeze  bool // SIGSTOP the waiters' master
		waiters int  // acquisitions waiting on its locks
	}{
		{"frozen-with-waiters", true, 8},
		// More calls held than one committer sets aside (defect 192).
		{"frozen-with-many-waiters", true, 28},
		{"waiters-alone", false, 8},
		{"frozen-alone", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			keptBesideFrozenMaster(t, tc.freeze, tc.waiters)
		})
	}
}

func keptBesideFrozenMaster(t *testing.T, freeze bool, waiters int) {
	const ttl = time.Second
	ctx := t.Context()
	nodes := testenv.StartRedisCluster(t, 3)
	admin := testenv.NewClusterAdmin(t, nodes)
	for _, n := range nodes {
		// The others mark the frozen master failed after the cluster's
		// node timeout (2 s): the healthy masters must go on serving
		// their slots for the test to watch three TTLs.
		if err := admin.Client(n).ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	base := testenv.Name(t)
	kept, probe := base+"-kept", ""
	_, healthy := slotOwner(t, admin, "fenced:{"+kept+"}:lease")
	var frozen *testenv.RedisProc
	var names []string // the waiters', all on frozen
	for i := 0; len(names) < max(waiters, 1); i++ {
		n := fmt.Sprintf("%s-w%d", base, i)
		if _, o := slotOwner(t, admin, "fenced:{"+n+"}:lease"); o != healthy && (frozen == nil || o == frozen) {
			frozen, names = o, append(names, n)
		}
	}
	for i := 0; probe == ""; i++ {
		n := fmt.Sprintf("%s-p%d", base, i)
		if _, o := slotOwner(t, admin, "fenced:{"+n+"}:lease"); o != frozen {
			probe = n
		}
	}

	reached := &reachingCalls{mark: base + "-w", reached: make(chan struct{}, 64)}
	rdb := clusterClient(t, nodes)
	rdb.OnNewNode(func(c *redis.Client) { // before the client's first call: every node
		if c.Options().Addr == frozen.Addr {
			c.AddHook(reached)
		}
	})
	c := newClient(t, newRedisStore(t, rdb, newSequencer(t)))
	// Every master's connection dialled and scripts loaded.
	for _, n := range append([]string{kept, probe}, names...) {
		l, err := c.TryAcquire(ctx, n, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, err := c.Acquire(ctx, kept, ttl, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}

	if freeze {
		frozen.Stop()
		t.Cleanup(frozen.Cont) // if the test fails before it lets go
	}
	froze := time.Now()
	reached.armed.Store(true)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var once sync.Once
	letGo := func() { // the waiters: the master answers, they end
		once.Do(func() {
			cancel()
			if freeze {
				frozen.Cont()
			}
			wg.Wait()
		})
	}
	t.Cleanup(letGo)
	for i, n := range names[:waiters] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(wctx, n, ttl, lock.WithWait(time.Minute))
			if err == nil {
				err = l.Release(context.WithoutCancel(wctx))
			}
			t.Logf("waiter %s after %s: %v", n, time.Since(froze).Round(time.Millisecond), err)
		}()
		switch {
		case i < 4:
			// Each alone, in a slot of its own: the next starts once its
			// call has reached the master.
			select {
			case <-reached.reached:
			case <-time.After(10 * time.Second):
				t.Fatalf("waiter %d's call did not reach its master", i)
			}
		default:
			// Each in a pipeline of its own too, sent beside those held
			// once they stalled, while the slots have room: past 20 held,
			// a committer's slots are full, and the call waits for one.
			select {
			case <-reached.reached:
			case <-time.After(200 * time.Millisecond): // two of the store's stalls
			}
		}
	}

	// A client of healthy masters goes on meanwhile.
	probed := make(chan error, 1)
	go func() {
		for range 20 {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := c.TryAcquire(pctx, probe, ttl)
			if err == nil {
				err = l.Release(pctx)
			}
			cancel()
			if err != nil {
				probed <- err
				return
			}
		}
		probed <- nil
	}()
	t.Cleanup(func() { // if the test fails first: t.Context ends its calls
		if probed != nil {
			<-probed
		}
	})
	watched := time.After(3 * ttl) // three TTLs, nine refreshes, once the waiters wait
	for probed != nil || watched != nil {
		select {
		case <-held.Done():
			t.Fatalf("the lock on a healthy master was lost %s after another master froze: %v; its TTL is %s, kept alive",
				time.Since(froze).Round(time.Millisecond), context.Cause(held.Context()), ttl)
		case err := <-probed:
			if err != nil {
				t.Errorf("a lock on a healthy master, %s after the freeze: %v", time.Since(froze).Round(time.Millisecond), err)
			}
			probed = nil
		case <-watched:
			watched = nil
		}
	}
	letGo()
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release of the kept lock: %v", err)
	}
}

// reachingCalls is a hook of a node's client: it signals reached when a
// script call of a name with prefix mark reaches the client, once armed.
type reachingCalls struct {
	mark    string
	armed   atomic.Bool
	reached chan struct{}
}

func (h *reachingCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *reachingCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.see(cmd)
		return next(ctx, cmd)
	}
}

func (h *reachingCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.see(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *reachingCalls) see(cmd redis.Cmder) {
	if !h.armed.Load() || !strings.HasPrefix(strings.ToLower(cmd.Name()), "eval") {
		return
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, h.mark) {
			select {
			case h.reached <- struct{}{}:
			default:
			}
			return
		}
	}
}

var _ redis.Hook = (*reachingCalls)(nil)
