package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/fenced/fenced/internal/testenv"
)

// A fair reentry joins the lock's queue in its create's Txn before it
// learns that its holder holds the lock. When the reentry then failed (its
// count Txn's context ended, etcd timed out), the acquire returned the
// error and the place stayed: the lock client leaves only after a held
// answer, and an etcd place lasts as long as its store's session. It stood
// ahead of every later fair waiter, and once the holder released, no fair
// waiter of any store could take the lock. An attempt that joined and ends
// with neither the lock nor a held answer now gives its place up.
func TestEtcdFailedReentryLeavesNoPlace(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	newStore := func() *Client {
		s, err := NewEtcdStore(cli, WithEtcdPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		c, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	c, other := newStore(), newStore()
	ctx := t.Context()
	name := testenv.Name(t)
	first, err := c.Acquire(ctx, name, 30*time.Second, WithHolder("h"))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reenterStepHook = func() {
		reenterStepHook = nil
		cancel() // the caller gives up between the reentry's steps
	}
	t.Cleanup(func() { reenterStepHook = nil })
	var held *HeldError
	if l, err := c.Acquire(rctx, name, 30*time.Second, WithHolder("h")); err == nil || errors.As(err, &held) {
		t.Fatalf("a fair reentry whose caller gave up between its steps: %v, %v; want its context's error", l, err)
	}
	q, err := cli.Get(ctx, c.store.(*EtcdStore).ks.QueuePrefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Kvs) != 0 {
		t.Errorf("after a fair reentry that failed, the queue holds %q; want it empty", q.Kvs[0].Key)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A fair waiter of another store takes the free lock.
	l, err := other.Acquire(ctx, name, 5*time.Second, WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("a fair waiter after the failed reentry's holder released: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// etcdWithMaxTxnOps starts a single-member embedded etcd that takes at
// most n operations per Txn (etcd's --max-txn-ops; 128 by default), and
// returns a client of it; both are closed with the test.
func etcdWithMaxTxnOps(t *testing.T, n uint) *clientv3.Client {
	t.Helper()
	for try := 1; ; try++ {
		cfg := embed.NewConfig()
		cfg.Dir = t.TempDir()
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop()) // its close logs errors
		cfg.UnsafeNoFsync = true
		cfg.MaxTxnOps = n
		cu, err := url.Parse(testenv.FreeURL(t))
		if err != nil {
			t.Fatal(err)
		}
		pu, err := url.Parse(testenv.FreeURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.InitialCluster = cfg.Name + "=" + pu.String()
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			if strings.Contains(err.Error(), "address already in use") && try < 5 {
				continue // another process took a port meanwhile
			}
			t.Fatalf("embedded etcd: %v", err)
		}
		t.Cleanup(e.Close)
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			t.Fatalf("embedded etcd: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("embedded etcd not ready after 30s")
		}
		return testenv.EtcdClient(t, cu.String())
	}
}

// The store's own Txns whose size grows with their input keep to its bound
// on operations per Txn (WithEtcdMaxBatch), as its batches of creates and
// deletes do: etcd refuses a larger one (--max-txn-ops) every time. The
// deletes of orphaned queue places went 100 to a Txn, and List read the
// queues of 32 locks (64 operations) per Txn: with etcd's bound below
// that, orphaned places stood for ever ahead of every fair waiter, and
// List failed. With a bound that matches etcd's, etcd refuses none of the
// store's Txns; a Txn etcd refuses even so is split, as batches are, so a
// store whose bound is above etcd's still works.
func TestEtcdTxnsKeepToTheBatchBound(t *testing.T) {
	const maxOps, n = 16, 40
	cli := etcdWithMaxTxnOps(t, maxOps)
	for _, tc := range []struct {
		name    string
		opts    []EtcdOption
		matches bool
	}{
		{"bound matches etcd's", []EtcdOption{WithEtcdMaxBatch(maxOps)}, true},
		{"default bound", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			prefix := "/" + testenv.Name(t) + "/"
			var logs testenv.SyncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			newStore := func() *EtcdStore {
				s, err := NewEtcdStore(cli, append([]EtcdOption{WithEtcdPrefix(prefix), WithEtcdLogger(log)}, tc.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			s, other := newStore(), newStore()
			name := testenv.Name(t)
			for i := range n {
				id := fmt.Sprintf("%032x", i+1)
				if _, err := s.Acquire(ctx, AcquireRequest{Name: fmt.Sprint(name, "-", i), LeaseID: id, TTL: 30 * time.Second}); err != nil {
					t.Fatal(err)
				}
			}
			t.Run("List", func(t *testing.T) {
				page, err := s.List(ctx, ListRequest{Prefix: name + "-", Limit: 100})
				if err != nil {
					t.Fatalf("List of %d locks: %v", n, err)
				}
				if len(page.Locks) != n {
					t.Fatalf("List of %d locks gave %d", n, len(page.Locks))
				}
			})
			t.Run("orphans", func(t *testing.T) {
				// n places in the queue of a lock another store holds.
				held := name + "-0"
				waiters := make([]string, n)
				for i := range waiters {
					waiters[i] = fmt.Sprintf("%032x", 1000+i)
					_, err := other.Acquire(ctx, AcquireRequest{Name: held, LeaseID: fmt.Sprintf("%032x", 2000+i), TTL: 30 * time.Second,
						Waiter: waiters[i], WaiterTTL: DefaultWaiterTTL})
					var he *HeldError
					if !errors.As(err, &he) {
						t.Fatalf("waiter %d on a held lock: %v, want a HeldError", i, err)
					}
				}
				// Their Leaves fail (etcd out of reach, as in an outage) while
				// no delete of orphans runs, so that all of them are deleted
				// together, as after an outage.
				other.mu.Lock()
				other.cleaning = true
				other.mu.Unlock()
				gone, cancel := context.WithCancel(ctx)
				cancel()
				for _, w := range waiters {
					if err := other.Leave(gone, held, w); err == nil {
						t.Fatal("Leave with a cancelled context succeeded")
					}
				}
				other.mu.Lock()
				other.cleaning = false
				other.poke()
				other.mu.Unlock()
				q := other.ks.QueuePrefix(held)
				testenv.WaitUntil(t, 20*time.Second, func() bool {
					r, err := cli.Get(ctx, q, clientv3.WithPrefix(), clientv3.WithCountOnly())
					return err == nil && r.Count == 0
				})
			})
			if refused := strings.Contains(logs.String(), "refused"); tc.matches && refused {
				t.Errorf("with a bound that matches etcd's, etcd refused a Txn as too large:\n%s", logs.String())
			}
		})
	}
}
