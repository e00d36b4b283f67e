package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
