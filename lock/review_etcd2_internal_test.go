package lock

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A reentry on etcd leases counts its hold in a Txn of its own (reenter's
// second step). When that Txn committed with its reply lost, the acquire
// failed and nobody got the hold, but it stayed counted: the holder's one
// release left the lock held, by nobody, until its deadline, the Redis
// store's defect 71 on etcd. A failed reentry now takes off the hold its
// op counted, fair (its waiter) or not (its attempt's lease id), and a
// retry with the same waiter counts its hold anew.
func TestEtcdFailedReentryLeavesNoHold(t *testing.T) {
	e, direct := testenv.Etcd(t)
	pr, cli := testenv.EtcdThroughProxy(t, e)
	kv := &failingReadKV{KV: cli.KV}
	cli.KV = kv
	prefix := "/" + testenv.Name(t) + "/"
	s, err := NewEtcdStore(cli, WithEtcdPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() { reenterStepHook = nil })
	ctx := t.Context()
	holderID, _ := newLeaseID()
	// With failRead, the clean-up's first read fails at once, as one sent
	// while the connection the reply was lost with is not back yet does
	// (seen on a busy machine): the clean-up must ask again.
	for _, c := range []struct{ fair, failRead bool }{{true, false}, {false, false}, {true, true}} {
		fair := c.fair
		t.Run(fmt.Sprintf("fair=%v,failRead=%v", fair, c.failRead), func(t *testing.T) {
			// The proxy cuts the connection at the first bytes etcd sends
			// after the count Txn went through it; another stream on the
			// connection may come first and cut it before etcd commits the
			// Txn. That is no lost reply: try again, on a new name.
			for try := 1; ; try++ {
				name := fmt.Sprintf("%s-%v-%d", testenv.Name(t), fair, try)
				if _, err := s.Acquire(ctx, AcquireRequest{Name: name, LeaseID: holderID, TTL: 30 * time.Second, Holder: "h"}); err != nil {
					t.Fatal(err)
				}
				req := AcquireRequest{Name: name, TTL: 30 * time.Second, Holder: "h"}
				req.LeaseID, _ = newLeaseID()
				if fair {
					req.Waiter, _ = newLeaseID()
					req.WaiterTTL = DefaultWaiterTTL
				}
				var lost <-chan struct{}
				reenterStepHook = func() {
					reenterStepHook = nil
					lost = pr.LoseReply([]byte(prefix + "count/" + name))
					kv.armed.Store(c.failRead)
				}
				_, aerr := s.Acquire(ctx, req)
				reenterStepHook = nil
				if lost == nil {
					t.Fatalf("the attempt did not reenter: %v", aerr)
				}
				<-lost
				r, err := direct.Get(ctx, prefix+"count/"+name)
				if err != nil {
					t.Fatal(err)
				}
				if aerr == nil || len(r.Kvs) != 1 || r.Kvs[0].Version < 2 {
					// The reply came through after all, or the count did
					// not commit: release what is held and try again.
					if aerr == nil {
						_ = s.Release(ctx, name, holderID, "")
					}
					_ = s.Release(ctx, name, holderID, "")
					if try == 5 {
						t.Fatalf("in %d tries, no reentry counted with its reply lost (last: %v)", try, aerr)
					}
					continue
				}
				// Nobody got the hold: it is not counted.
				st, err := s.Inspect(ctx, name)
				if err != nil || !st.Held || st.Count != 1 {
					t.Errorf("after a reentry that failed with its reply lost (%v): %+v, %v; want held once", aerr, st, err)
				}
				if fair {
					// The same waiter asks again (the caller rides out the
					// failure): it is counted anew, and released.
					g, err := s.Acquire(ctx, req)
					if err != nil || g.Count != 2 {
						t.Fatalf("the reentry asked again with its waiter: %+v, %v; want held twice", g, err)
					}
					if err := s.Release(ctx, name, holderID, ""); err != nil {
						t.Fatal(err)
					}
				}
				// The holder's one release frees the lock.
				if err := s.Release(ctx, name, holderID, ""); err != nil {
					t.Fatal(err)
				}
				l, err := direct.Get(ctx, prefix+"locks/"+name)
				if err != nil {
					t.Fatal(err)
				}
				if len(l.Kvs) != 0 {
					c, _ := direct.Get(ctx, prefix+"count/"+name)
					t.Fatalf("a reentry that failed with its reply lost (%v) left the lock held after its holder's release (count %q)", aerr, c.Kvs[0].Value)
				}
				return
			}
		})
	}
}

// failingReadKV is etcd's KV, except that once armed it fails the next
// read-only Txn (neither If nor Else: unreenter's read) at once, with the
// error of a request on a connection that was just cut.
type failingReadKV struct {
	clientv3.KV
	armed atomic.Bool
}

func (k *failingReadKV) Txn(ctx context.Context) clientv3.Txn {
	return &failingReadTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type failingReadTxn struct {
	clientv3.Txn
	kv   *failingReadKV
	cond bool // If or Else was given
}

func (t *failingReadTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cond, t.Txn = true, t.Txn.If(cs...)
	return t
}

func (t *failingReadTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *failingReadTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.cond, t.Txn = true, t.Txn.Else(ops...)
	return t
}

func (t *failingReadTxn) Commit() (*clientv3.TxnResponse, error) {
	if !t.cond && t.kv.armed.CompareAndSwap(true, false) {
		return nil, status.Error(codes.Unavailable, "error reading from server: EOF (injected)")
	}
	return t.Txn.Commit()
}
