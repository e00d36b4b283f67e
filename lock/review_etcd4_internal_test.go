package lock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdLateJoinLeavesNoPlace: a fair attempt's queue join went out in
// a Txn, and its caller left before the answer (its context ended). The
// store orphans such a place and deletes its key, but the delete could
// reach etcd before the join did: the join then made the key again, with
// nobody to delete it, ahead of every fair waiter of the lock in every
// process for as long as the store's session lived (defect 12's
// symptom). Here the join is held back until the store has had its
// chance to delete the orphan, then committed, as etcd applies a Txn it
// received even after its client gave up on it.
func TestEtcdLateJoinLeavesNoPlace(t *testing.T) {
	e, cli := testenv.Etcd(t)
	direct, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	kv := &holdingKV{KV: cli.KV, held: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	cli.KV = kv
	prefix := "/" + testenv.Name(t) + "/"
	s, name, holder := storeHolding(t, cli, prefix)
	ctx := t.Context()

	// A fair waiter's first attempt: the store holds the lock, so it joins
	// the queue at once; its Txn is held in flight.
	kv.armed.Store(true)
	wctx, leave := context.WithCancel(ctx)
	req := AcquireRequest{Name: name, TTL: 30 * time.Second, WaiterTTL: DefaultWaiterTTL}
	req.LeaseID, _ = newLeaseID()
	req.Waiter, _ = newLeaseID()
	acquired := make(chan error, 1)
	go func() { _, err := s.Acquire(wctx, req); acquired <- err }()
	<-kv.held
	leave()
	if err := <-acquired; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire: %v, want the caller's context.Canceled", err)
	}
	// The store deletes the orphaned place off the caller's path; let it
	// (or let it wait for the join in flight) before the join commits.
	sk := slotKey{name, 0}
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.cleaning && (!s.orphans[sk] || s.joining[sk] > 0)
	})
	close(kv.release)
	<-kv.done

	queue := func() int64 {
		r, err := direct.Get(ctx, s.ks.QueuePrefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	testenv.WaitUntil(t, 10*time.Second, func() bool { return queue() == 0 })

	// What a user sees: once the holder releases, another process's fair
	// waiter takes the lock at its first attempt.
	if err := s.Release(ctx, name, holder, ""); err != nil {
		t.Fatal(err)
	}
	other, err := NewEtcdStore(direct, WithEtcdPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	req2 := AcquireRequest{Name: name, TTL: 30 * time.Second, WaiterTTL: DefaultWaiterTTL}
	req2.LeaseID, _ = newLeaseID()
	req2.Waiter, _ = newLeaseID()
	if _, err := other.Acquire(ctx, req2); err != nil {
		t.Fatalf("a fair waiter of a free lock: %v; queue keys: %d", err, queue())
	}
}

// holdingKV is etcd's KV, except that once armed it holds the next batch
// Txn (one with a nested Txn: the group commit's) until release, and then
// commits it whatever became of its context, as etcd applies a Txn it
// received after the client gave up on it.
type holdingKV struct {
	clientv3.KV
	armed               atomic.Bool
	held, release, done chan struct{}
}

func (k *holdingKV) Txn(ctx context.Context) clientv3.Txn {
	return &holdingTxn{ctx: ctx, kv: k}
}

// holdingTxn keeps what it is given, and builds etcd's Txn at Commit.
type holdingTxn struct {
	ctx          context.Context
	kv           *holdingKV
	cmps         []clientv3.Cmp
	thens, elses []clientv3.Op
}

func (t *holdingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *holdingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thens = append(t.thens, ops...)
	return t
}

func (t *holdingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elses = append(t.elses, ops...)
	return t
}

func (t *holdingTxn) Commit() (*clientv3.TxnResponse, error) {
	batch := false
	for _, op := range t.thens {
		batch = batch || op.IsTxn()
	}
	if !batch || !t.kv.armed.CompareAndSwap(true, false) {
		return t.kv.KV.Txn(t.ctx).If(t.cmps...).Then(t.thens...).Else(t.elses...).Commit()
	}
	close(t.kv.held)
	<-t.kv.release
	defer close(t.kv.done)
	resp, err := t.kv.KV.Txn(context.WithoutCancel(t.ctx)).If(t.cmps...).Then(t.thens...).Else(t.elses...).Commit()
	if err == nil {
		err = t.ctx.Err() // what etcd's client tells a caller that gave up
	}
	return resp, err
}

// TestEtcdJoinOfALeftCallerIsNotSent: a batch sent again (split in halves
// after etcd refused it as too large, or given fresh sessions after one
// expired) still carried the queue join of a caller that had left
// meanwhile, whose orphaned place the store may have deleted already:
// the join made the key again, as in TestEtcdLateJoinLeavesNoPlace. A
// join whose place is no longer its caller's is not sent.
func TestEtcdJoinOfALeftCallerIsNotSent(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s, name, _ := storeHolding(t, cli, "/"+testenv.Name(t)+"/")
	ctx := t.Context()
	req := AcquireRequest{Name: name, TTL: 30 * time.Second, WaiterTTL: DefaultWaiterTTL}
	req.LeaseID, _ = newLeaseID()
	req.Waiter, _ = newLeaseID()
	sess, err := s.sessionFor(ctx, req.TTL, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	op := s.createOp(req, sess, time.Now())
	if !op.placed || op.waiterRev != 0 {
		t.Fatalf("the attempt does not join the queue (placed %v, rev %d): the test tests nothing", op.placed, op.waiterRev)
	}
	// Its caller leaves before the batch is sent (again).
	s.mu.Lock()
	s.orphanLocked(placeKey{name, req.Waiter})
	s.mu.Unlock()
	v, err := s.gc.Do(ctx, name, op)
	if !errors.Is(err, errHeld) {
		t.Fatalf("create of a held lock: %v, want errHeld", err)
	}
	if hr := v.(heldResult); hr.joinedRev != 0 {
		t.Fatalf("the join of a caller that left was sent: its key made at revision %d", hr.joinedRev)
	}
}

// storeHolding is a store on cli under prefix that holds a lock (name) by
// lease id holder: a fair attempt of the same store joins its queue at once.
func storeHolding(t *testing.T, cli *clientv3.Client, prefix string) (s *EtcdStore, name, holder string) {
	t.Helper()
	s, err := NewEtcdStore(cli, WithEtcdPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	name = testenv.Name(t)
	holder, _ = newLeaseID()
	if _, err := s.Acquire(t.Context(), AcquireRequest{Name: name, LeaseID: holder, TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	return s, name, holder
}

// TestEtcdOrphanedWhileDeletingIsDeleted: a place orphaned while the store
// was deleting other orphans poked a store that was busy, and when that
// delete ended nothing woke the store again: the place's key stood, ahead
// of every fair waiter, until some other event (a session's renewal, a
// lock's deadline) came, if any. The end of a delete now looks again.
func TestEtcdOrphanedWhileDeletingIsDeleted(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s, name, _ := storeHolding(t, cli, "/"+testenv.Name(t)+"/")
	ctx := t.Context()
	var waiters [2]string
	for i := range waiters {
		req := AcquireRequest{Name: name, TTL: time.Minute, WaiterTTL: DefaultWaiterTTL}
		req.LeaseID, _ = newLeaseID()
		req.Waiter, _ = newLeaseID()
		if _, err := s.Acquire(ctx, req); !errors.As(err, new(*HeldError)) {
			t.Fatalf("waiter %d: %v, want a HeldError", i, err)
		}
		waiters[i] = req.Waiter
	}
	// A delete of orphans runs (cleaning), and both places are orphaned
	// meanwhile (their Leaves fail); the running delete took the first.
	s.mu.Lock()
	s.cleaning = true
	s.mu.Unlock()
	gone, cancel := context.WithCancel(ctx)
	cancel()
	for _, w := range waiters {
		if err := s.Leave(gone, name, w); err == nil {
			t.Fatal("Leave with a cancelled context succeeded")
		}
	}
	s.mu.Lock()
	first := slotKey{name, 0}
	if !s.orphans[first] || len(s.orphans) != 2 {
		s.mu.Unlock()
		t.Fatalf("orphans %v, want slots 0 and 1", s.orphans)
	}
	s.wg.Add(1)
	s.mu.Unlock()
	s.deleteOrphans([]slotKey{first})

	// The holder's session (30 s TTL) is renewed every 10 s: after this.
	testenv.WaitUntil(t, 5*time.Second, func() bool {
		r, err := cli.Get(ctx, s.ks.QueuePrefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0
	})
}
