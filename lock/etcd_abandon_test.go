package lock_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defect 147: etcd committed an attempt's create after its caller gave up
// and after the store's abandon had found nothing to release. The create
// went to a follower whose link to the leader held the forwarded proposal;
// the release went to the leader. Nobody knew of the lock, and it stayed
// for as long as the store's session lived: 12 to 16 s past its 2 s TTL
// while another lock kept the session alive (the review's reproduction).
func TestEtcdCreateCommittedAfterItsAbandonTakesNothing(t *testing.T) {
	t.Parallel()
	members, peers := testenv.EtcdClusterProxied(t, 3)
	testenv.WaitUntil(t, 10*time.Second, func() bool { return testenv.Leader(members) != nil })
	lead := slices.IndexFunc(members, (*sequencer.Embedded).IsLeader)
	f := slices.IndexFunc(members, func(m *sequencer.Embedded) bool { return !m.IsLeader() })
	prefix := "/" + testenv.Name(t) + "/"
	name := testenv.Name(t)

	// The store talks to the leader, but for the victim's create while
	// armed, which goes to the follower: a balancer's choice.
	cli := testenv.EtcdClient(t, members[lead].ClientURL())
	key := sequencer.NewKeyspace(prefix).LockKey(name)
	r := &routedKV{KV: cli.KV, alt: testenv.EtcdClient(t, members[f].ClientURL()).KV, route: func(ops []clientv3.Op) bool { return puts(ops, key) }}
	cli.KV = r
	c := newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix)))
	other := newClient(t, newEtcdStore(t, testenv.EtcdClient(t, members[lead].ClientURL()), lock.WithEtcdPrefix(prefix)))
	ctx := t.Context()
	const ttl = 2 * time.Second
	// Another lock of the same TTL keeps the store's session alive.
	keeper, err := c.Acquire(ctx, testenv.Name(t), ttl, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Release(ctx)

	peers[f].Hold(true)
	held := true
	defer func() {
		if held {
			peers[f].Hold(false)
		}
	}()
	r.armed.Store(true)
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.TryAcquire(actx, name, ttl)
	cancel()
	r.armed.Store(false)
	if err == nil {
		t.Fatal("acquired through a follower cut off from the leader")
	}
	// The fault's length: the abandon is answered by the leader meanwhile.
	time.Sleep(1200 * time.Millisecond)
	peers[f].Hold(false)
	held = false
	healed := time.Now()
	testenv.WaitUntil(t, 3*time.Second, func() bool {
		l, err := other.TryAcquire(ctx, name, time.Second)
		return err == nil && l.Release(ctx) == nil
	})
	t.Logf("free %s after the follower's link was let go", time.Since(healed).Round(time.Millisecond))
}

// routedKV sends to alt, while armed, the requests route picks (a
// balancer's choice of member), and every other request to its own KV:
// a Delete, or a Txn, recorded and sent at Commit so that route sees its
// operations (Then's and Else's).
type routedKV struct {
	clientv3.KV
	alt    clientv3.KV
	route  func(ops []clientv3.Op) bool
	armed  atomic.Bool
	once   bool         // disarmed by the first request it routes
	routed atomic.Int32 // requests sent to alt
}

func (r *routedKV) pick(ops []clientv3.Op) clientv3.KV {
	if r.route(ops) && (r.once && r.armed.CompareAndSwap(true, false) || !r.once && r.armed.Load()) {
		r.routed.Add(1)
		return r.alt
	}
	return r.KV
}

func (r *routedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return r.pick([]clientv3.Op{clientv3.OpDelete(key, opts...)}).Delete(ctx, key, opts...)
}

func (r *routedKV) Txn(ctx context.Context) clientv3.Txn { return &routedTxn{r: r, ctx: ctx} }

type routedTxn struct {
	r         *routedKV
	ctx       context.Context
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *routedTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.cmps = cs; return t }
func (t *routedTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.then = ops; return t }
func (t *routedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.els = ops; return t }

func (t *routedTxn) Commit() (*clientv3.TxnResponse, error) {
	kv := t.r.pick(append(slices.Clone(t.then), t.els...))
	return kv.Txn(t.ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
}

// puts reports whether ops, nested Txns included, put key.
func puts(ops []clientv3.Op, key string) bool {
	for _, op := range ops {
		if op.IsTxn() {
			_, then, els := op.Txn()
			if puts(then, key) || puts(els, key) {
				return true
			}
		} else if op.IsPut() && string(op.KeyBytes()) == key {
			return true
		}
	}
	return false
}
