package etcdkv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/etcdkv"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// faulty is etcd's KV, except for the first Txn sent through it: held
// unanswered until its caller gives up (as a member cut off from its
// peers holds what it took), or refused as a member without a leader
// refuses it, before it runs.
type faulty struct {
	clientv3.KV
	refuse bool
	sent   atomic.Int64
}

func (f *faulty) Txn(ctx context.Context) clientv3.Txn {
	if f.sent.Add(1) == 1 {
		return &faultyTxn{ctx: ctx, refuse: f.refuse}
	}
	return f.KV.Txn(ctx)
}

type faultyTxn struct {
	ctx    context.Context
	refuse bool
}

func (t *faultyTxn) If(...clientv3.Cmp) clientv3.Txn  { return t }
func (t *faultyTxn) Then(...clientv3.Op) clientv3.Txn { return t }
func (t *faultyTxn) Else(...clientv3.Op) clientv3.Txn { return t }
func (t *faultyTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.refuse {
		return nil, rpctypes.ErrNoLeader
	}
	<-t.ctx.Done()
	return nil, t.ctx.Err()
}

func setup(t *testing.T, refuse bool) (key string, cli *clientv3.Client, f *faulty) {
	_, cli = testenv.Etcd(t)
	key = "/" + testenv.Name(t)
	if _, err := cli.Put(t.Context(), key, "before"); err != nil {
		t.Fatal(err)
	}
	f = &faulty{KV: cli.KV, refuse: refuse}
	cli.KV = f
	return key, cli, f
}

func value(t *testing.T, cli *clientv3.Client, key string) string {
	r, err := cli.Get(t.Context(), key)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("read %s: %v, %v", key, r, err)
	}
	return string(r.Kvs[0].Value)
}

// A Txn a member refused for want of a leader ran nothing: it is sent on,
// and applies once.
func TestRefusedTxnIsSentOn(t *testing.T) {
	key, cli, f := setup(t, true)
	resp, err := etcdkv.New(cli).Txn(t.Context()).Then(clientv3.OpPut(key, "after")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("a refused write: %v, %v", resp, err)
	}
	if n := f.sent.Load(); n != 2 {
		t.Fatalf("%d sends, want 2", n)
	}
	if v := value(t, cli, key); v != "after" {
		t.Fatalf("value %q", v)
	}
}

// A write held unanswered is not sent again: etcd may yet apply it.
func TestHeldWriteIsNotSentAgain(t *testing.T) {
	key, cli, f := setup(t, false)
	ctx, cancel := context.WithTimeout(t.Context(), 3*etcdkv.Stall)
	defer cancel()
	_, err := etcdkv.New(cli).Txn(ctx).Then(clientv3.OpPut(key, "after")).Commit()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a held write: %v, want its caller's deadline", err)
	}
	if n := f.sent.Load(); n != 1 {
		t.Fatalf("%d sends, want 1", n)
	}
	if v := value(t, cli, key); v != "before" {
		t.Fatalf("value %q", v)
	}
}

// readSentTwice reads key through etcdkv over a KV whose first Txn is
// held until its caller gives up (refuse false) or refused for want of a
// leader, and checks that the read was sent twice and saw the value.
func readSentTwice(t *testing.T, refuse bool, read func(ctx context.Context, kv clientv3.KV, key string) (string, error)) {
	t.Helper()
	key, cli, f := setup(t, refuse)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := read(ctx, etcdkv.New(cli), key)
	if err != nil || got != "before" {
		t.Fatalf("read %q, %v; want %q", got, err, "before")
	}
	if n := f.sent.Load(); n != 2 {
		t.Fatalf("%d sends, want 2", n)
	}
}

// readTxn reads key with a read-only Txn.
func readTxn(ctx context.Context, kv clientv3.KV, key string) (string, error) {
	resp, err := kv.Txn(ctx).Then(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", err
	}
	return string(resp.Responses[0].GetResponseRange().Kvs[0].Value), nil
}

// readGet reads key with a Get, whose answer must carry the header.
func readGet(ctx context.Context, kv clientv3.KV, key string) (string, error) {
	resp, err := kv.Get(ctx, key)
	if err != nil {
		return "", err
	}
	if resp.Header.GetRevision() == 0 {
		return "", fmt.Errorf("a Get's answer without its header: %v", resp)
	}
	return string(resp.Kvs[0].Value), nil
}

// A read-only Txn held unanswered is sent again after Stall, and the
// second answer taken.
func TestHeldReadIsSentAgain(t *testing.T) { readSentTwice(t, false, readTxn) }

// A Get held unanswered is sent again after Stall, and the second answer
// taken (the floor read, a waiter's look at the key it watches).
func TestHeldGetIsSentAgain(t *testing.T) { readSentTwice(t, false, readGet) }

// A Get refused for want of a leader is sent on, as a Txn is (when every
// member refuses it, the refusal is the answer at once:
// sequencer.TestReadsSayNoLeader).
func TestRefusedGetIsSentOn(t *testing.T) { readSentTwice(t, true, readGet) }

// A member that holds what reaches it (frozen, or cut off from its peers
// and not yet aware) must not hold a read past the hedge, while other
// requests of the process take the balancer's turns meanwhile. Before,
// the one send again went to whichever member's turn it was, the holding
// one as often as another, and a read held until its caller gave up came
// within the 60 reads in each of four runs (defect 112).
func TestHedgeReachesAnotherMember(t *testing.T) {
	t.Parallel()
	members := testenv.EtcdCluster(t, 3)
	held, err := faultproxy.New(strings.TrimPrefix(members[0].ClientURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	cli := testenv.EtcdClient(t, "http://"+held.Addr(), members[1].ClientURL(), members[2].ClientURL())
	key := "/" + testenv.Name(t)
	if _, err := cli.Put(t.Context(), key, "v"); err != nil {
		t.Fatal(err)
	}
	kv := etcdkv.New(cli)
	held.Hold(true)
	t.Cleanup(func() { held.Hold(false) })

	// Others' requests, each given up after 100 ms (a third of them go to
	// the holding member), keep the balancer's turn moving.
	ctx, stop := context.WithCancel(t.Context())
	var others sync.WaitGroup
	for range 4 {
		others.Go(func() {
			for ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, _ = cli.KV.Txn(rctx).Then(clientv3.OpGet(key)).Commit()
				cancel()
			}
		})
	}
	defer others.Wait()
	defer stop()

	for i := range 60 {
		rctx, cancel := context.WithTimeout(t.Context(), etcdkv.Stall+300*time.Millisecond)
		_, err := kv.Get(rctx, key)
		cancel()
		if err != nil {
			t.Fatalf("read %d with one member of three holding what it gets: %v", i, err)
		}
	}
}

// A read whose every send of the first round went to the holding member
// (others' requests took the balancer's turns between them) is sent again
// in another round, restall later. Before, it was held until its caller
// gave up: TestHedgeReachesAnotherMember met it in two of six runs on a
// loaded machine (CI), about once in 200 held reads (defect 129).
func TestHedgeSendsAnotherRound(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	url := e.ClientURL()
	cli := testenv.EtcdClient(t, url, url, url) // a read and its round of two sends again
	var sends atomic.Int64
	held := func(ctx context.Context) (int64, error) {
		if n := sends.Add(1); n > 3 {
			return n, nil
		}
		<-ctx.Done() // each of the first three reached the holding member
		return 0, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(t.Context(), etcdkv.Stall+5*time.Second)
	defer cancel()
	n, err := etcdkv.Hedge(ctx, cli, held)
	if err != nil || n <= 3 {
		t.Fatalf("a read whose first round was held: send %d answered, %v; want a send of the next round", n, err)
	}
}
