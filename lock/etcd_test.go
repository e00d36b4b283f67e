package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcd lease store's own design (docs/design.md, "etcd leases"):
// sessions, deadlines enforced by the store, group-committed writes.

func newEtcdStore(t *testing.T, cli *clientv3.Client, opts ...lock.EtcdOption) *lock.EtcdStore {
	t.Helper()
	s, err := lock.NewEtcdStore(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A lock whose holder stops refreshing is free at its TTL, while another
// lock of the same store, on the same session, is kept alive.
func TestEtcdUnrefreshedLockFreesAloneAtItsTTL(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli)
	c := newClient(t, s)
	kept, err := c.Acquire(t.Context(), testenv.Name(t), 300*time.Millisecond, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Release(t.Context())
	name := testenv.Name(t)
	abandoned, err := c.Acquire(t.Context(), name, 300*time.Millisecond, lock.WithDetached()) // never refreshed
	if err != nil {
		t.Fatal(err)
	}
	next, err := c.Acquire(t.Context(), name, time.Second, lock.WithWait(10*time.Second))
	if err != nil {
		t.Fatalf("the unrefreshed lock was not freed: %v", err)
	}
	defer next.Release(t.Context())
	if next.Token() <= abandoned.Token() {
		t.Fatalf("token %d after %d", next.Token(), abandoned.Token())
	}
	if st, err := c.Inspect(t.Context(), kept.Name()); err != nil || st.LeaseID != kept.ID() || kept.Err() != nil {
		t.Fatalf("the kept-alive lock of the same store: %+v, %v, Err %v", st, err, kept.Err())
	}
}

// A store that stops (its process died) leaves its locks to its session
// lease: they are freed when it expires, not kept forever.
func TestEtcdDeadStoresLocksFree(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	dead := newEtcdStore(t, cli)
	name := testenv.Name(t)
	if _, err := dead.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: "0123456789abcdef0123456789abcdef", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	dead.Close()
	c := newClient(t, newEtcdStore(t, cli))
	l, err := c.Acquire(t.Context(), name, time.Second, lock.WithWait(30*time.Second))
	if err != nil {
		t.Fatalf("the dead store's lock was not freed by its session: %v", err)
	}
	l.Release(t.Context())
}

// A lock acquired through one store and refreshed through another (another
// fenced node) moves to the second: the first must not delete it at the
// old deadline, and its token does not change.
func TestEtcdRefreshThroughAnotherStore(t *testing.T) {
	_, cli := testenv.Etcd(t)
	a, b := newEtcdStore(t, cli), newEtcdStore(t, cli)
	name := testenv.Name(t)
	id := "0123456789abcdef0123456789abcdef"
	g, err := a.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: id, TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	before := a.Stats().Txns
	g2, err := b.Refresh(t.Context(), name, id, 5*time.Second, 0)
	if err != nil || g2.Token != g.Token || g2.TTL != 5*time.Second {
		t.Fatalf("refresh through the other store: %+v, %v; granted %+v", g2, err, g)
	}
	// The first store's deadline passes; it tries to delete the lock as it
	// wrote it, and must find it moved.
	testenv.WaitUntil(t, 30*time.Second, func() bool { return a.Stats().Txns > before })
	st, err := b.Inspect(t.Context(), name)
	if err != nil || !st.Held || st.LeaseID != id || st.Token != g.Token {
		t.Fatalf("after the first store's deadline: %+v, %v; want still held by %s with token %d", st, err, id, g.Token)
	}
	if err := b.Release(t.Context(), name, id, ""); err != nil {
		t.Fatal(err)
	}
}

// Refreshes that alternate between two stores (two fenced nodes behind a
// load balancer) keep the lock: each store finds it moved by the other and
// takes it back, and the last store's deadline still frees it at its TTL.
func TestEtcdRefreshesAlternateBetweenStores(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	a, b := newEtcdStore(t, cli), newEtcdStore(t, cli)
	name := testenv.Name(t)
	id := "0123456789abcdef0123456789abcdef"
	g, err := a.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: id, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range []*lock.EtcdStore{b, a, b, a} {
		ttl := 5 * time.Second
		if i == 3 {
			ttl = 300 * time.Millisecond
		}
		g2, err := s.Refresh(t.Context(), name, id, ttl, 0)
		if err != nil || g2.Token != g.Token {
			st, _ := a.Inspect(t.Context(), name)
			t.Fatalf("refresh %d: %+v, %v; the lock: %+v", i+1, g2, err, st)
		}
	}
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := b.Inspect(t.Context(), name)
		return err == nil && !st.Held
	})
}

// Budget: an acquire plus a release cost at most two Raft writes,
// amortised, sessions included.
func TestEtcdRaftWritesPerLock(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli)
	c := newClient(t, s)
	const n = 200
	for i := 0; i < n; i++ {
		l, err := c.Acquire(t.Context(), fmt.Sprint(testenv.Name(t), "-", i%7), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if writes := st.Txns + st.SessionGrants; writes > 2*n+1 {
		t.Fatalf("%d Raft writes for %d acquire+release (%+v): over two each", writes, n, st)
	}
	t.Logf("%d acquire+release sequentially: %+v", n, st)
}

// A batch etcd refuses as too large (its --max-txn-ops, 128 by default) is
// split, and no caller fails because of batching.
func TestEtcdBatchOverMaxTxnOps(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli, lock.WithEtcdMaxBatch(1000))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := make(chan struct{})
	prefix := testenv.Name(t)
	for i := 0; i < 600; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			id := fmt.Sprintf("%032x", i+1)
			name := fmt.Sprint(prefix, "-", i)
			_, err := s.Acquire(context.Background(), lock.AcquireRequest{Name: name, LeaseID: id, TTL: 5 * time.Second})
			if err == nil {
				err = s.Release(context.Background(), name, id, "")
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of 600 callers failed, first: %v", len(errs), errs[0])
	}
	st := s.Stats()
	if st.Ops != 1200 || st.Txns >= st.Ops || st.SessionGrants != 1 {
		t.Fatalf("stats %+v: want 1200 operations batched, on one session", st)
	}
	t.Logf("600 acquire+release at once: %+v", st)
}

// A released lock's lease id may release it again (a retried release) on
// the store that released it; a stranger may not.
func TestEtcdReleaseAfterExpiry(t *testing.T) {
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli)
	name := testenv.Name(t)
	id := "0123456789abcdef0123456789abcdef"
	if _, err := s.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: id, TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntil(t, 30*time.Second, func() bool { st, _ := s.Inspect(t.Context(), name); return !st.Held })
	if err := s.Release(t.Context(), name, id, ""); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("release after the lock expired: %v, want ErrLost", err)
	}
	if _, err := s.Refresh(t.Context(), name, id, time.Second, 0); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("refresh after the lock expired: %v, want ErrLost", err)
	}
}

// A batch whose creates all find their locks held writes nothing, and its
// header's revision is the last write's: it must not be taken for etcd
// going back in time (which raises the floor).
func TestEtcdHeldAttemptsLeaveTheFloorAlone(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	c := newClient(t, s)
	name := testenv.Name(t)
	l, err := c.Acquire(t.Context(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	before, err := sequencer.ReadFloor(t.Context(), cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.TryAcquire(context.Background(), name, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
				t.Errorf("TryAcquire on a held lock: %v", err)
			}
		}()
	}
	wg.Wait()
	after, err := sequencer.ReadFloor(t.Context(), cli, prefix)
	if err != nil || after.Offset != before.Offset {
		t.Fatalf("the floor moved from %d to %d (%v) after attempts on a held lock", before.Offset, after.Offset, err)
	}
}

// Many locks refreshed at once are checked by a few read-only Txns, not
// one each, and none is a Raft write.
func TestEtcdRefreshesShareReads(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli)
	c := newClient(t, s)
	const n = 300
	leases := make([]*lock.Lease, n)
	// A TTL that outlasts the 300 acquisitions on a loaded machine (11 s
	// in one CI run), so that no refresh finds its lease expired.
	for i := range leases {
		l, err := c.Acquire(t.Context(), fmt.Sprint(testenv.Name(t), "-", i), time.Minute, lock.WithDetached())
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	before := s.Stats()
	var wg sync.WaitGroup
	for _, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Refresh(context.Background(), time.Minute); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	after := s.Stats()
	if reads := after.Reads - before.Reads; reads == 0 || reads >= n/2 || after.Txns != before.Txns {
		t.Fatalf("%d refreshes: %d reads and %d write Txns; want them batched into reads", n, reads, after.Txns-before.Txns)
	}
	t.Logf("%d refreshes at once: %d read-only Txns", n, after.Reads-before.Reads)
}

// A lock taken again by the same store after a release keeps its own
// deadline: the deadline its name had under the lease before must not
// expire it. (The store's deadline entries were matched by a counter per
// holding, which a new holding of the same name started again.)
func TestEtcdDeadlineOfAnEarlierHoldingOfTheName(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli)
	name := testenv.Name(t)
	first, second := "0123456789abcdef0123456789abcde1", "0123456789abcdef0123456789abcde2"
	// Long enough for the acquire and release before it ends on a loaded
	// machine (200 ms was not, in one CI run).
	const firstTTL = time.Second
	start := time.Now()
	if _, err := s.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: first, TTL: firstTTL}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(t.Context(), name, first, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: second, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// Watch the lock past the first holding's deadline, with room for the
	// store to act on it.
	for time.Since(start) < firstTTL+500*time.Millisecond {
		st, err := s.Inspect(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Held || st.LeaseID != second {
			t.Fatalf("%s after the first acquire, the lock taken again with a 5s TTL is %+v: freed at the deadline of the lease before it", time.Since(start).Round(time.Millisecond), st)
		}
		time.Sleep(20 * time.Millisecond) // sample the state as time passes
	}
}

// Batches in flight together (WithEtcdInflight) are ordered by etcd like
// any two clients' Txns: many clients on a few names, fair and unfair,
// never hold a name at once, and each name's tokens grow with every grant.
func TestEtcdTxnsInFlightKeepExclusion(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	s := newEtcdStore(t, cli, lock.WithEtcdInflight(4))
	c := newClient(t, s)
	const clients, rounds = 32, 25
	names := []string{testenv.Name(t), testenv.Name(t), testenv.Name(t), testenv.Name(t)}
	type guard struct {
		holders atomic.Int32
		last    fence.Token // written only by the holder
	}
	guards := make([]guard, len(names))
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []lock.Option{lock.WithWait(30 * time.Second)}
			if i%2 == 1 {
				opts = append(opts, lock.WithUnfair())
			}
			for r := range rounds {
				k := (i + r) % len(names)
				l, err := c.Acquire(t.Context(), names[k], 10*time.Second, opts...)
				if err != nil {
					errs <- fmt.Errorf("client %d: acquire: %w", i, err)
					return
				}
				g := &guards[k]
				if n := g.holders.Add(1); n != 1 {
					errs <- fmt.Errorf("%d holders of %s at once", n, names[k])
				}
				if l.Token() <= g.last {
					errs <- fmt.Errorf("%s: token %d after %d", names[k], l.Token(), g.last)
				}
				g.last = l.Token()
				g.holders.Add(-1)
				if err := l.Release(t.Context()); err != nil {
					errs <- fmt.Errorf("client %d: release: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := s.Stats(); st.MaxInflight < 2 {
		t.Errorf("at most %d Txn in flight at once (%d Txns for %d operations): the test did not exercise batches in flight together", st.MaxInflight, st.Txns, st.Ops)
	}
	for _, name := range names {
		if st, err := s.Inspect(t.Context(), name); err != nil || st.Held {
			t.Errorf("%s after every client released it: %+v, %v", name, st, err)
		}
	}
}

func TestEtcdInflightOption(t *testing.T) {
	_, cli := testenv.Etcd(t)
	for _, n := range []int{0, -1, 65} {
		if _, err := lock.NewEtcdStore(cli, lock.WithEtcdInflight(n)); err == nil || !strings.Contains(err.Error(), "want 1 to 64") {
			t.Errorf("WithEtcdInflight(%d): %v, want an error that says 1 to 64", n, err)
		}
	}
}

// A call to the store returns when its context ends, even while etcd hangs
// and the call is the one sending its batch: a batch's Txn has its own
// bound (10 s), which must not become the caller's.
func TestEtcdCallsEndWithTheirContextWhileEtcdHangs(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	p, cli := testenv.EtcdThroughProxy(t, e)
	s := newEtcdStore(t, cli)
	name := testenv.Name(t)
	id := "0123456789abcdef0123456789abcdef"
	if _, err := s.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: id, TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	p.Hold(true) // etcd stops answering this client
	defer p.Hold(false)
	for _, c := range []struct {
		op string
		f  func(context.Context) error
	}{
		{"release", func(ctx context.Context) error { return s.Release(ctx, name, id, "") }},
		{"acquire", func(ctx context.Context) error {
			_, err := s.Acquire(ctx, lock.AcquireRequest{Name: testenv.Name(t), LeaseID: "1123456789abcdef0123456789abcdef", TTL: 30 * time.Second})
			return err
		}},
		{"refresh", func(ctx context.Context) error { _, err := s.Refresh(ctx, name, id, 30*time.Second, 0); return err }},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		t0 := time.Now()
		err := c.f(ctx)
		took := time.Since(t0)
		cancel()
		if err == nil {
			t.Errorf("%s succeeded while etcd hung", c.op)
		}
		if took > 2*time.Second {
			t.Errorf("%s returned %s after it began, its context ended at 300ms (err %v)", c.op, took.Round(time.Millisecond), err)
		}
	}
}

// Fair waiters of a store reuse its queue keys: a hot lock's queue does
// not leave a deleted key behind for every wait. etcd keeps deleted keys
// in its index until history is compacted, and every compare and count
// over the queue visits them, so a key per wait slowed a hot lock from
// 557 to 199 handoffs a second in 40 s (docs/design.md, defect 10).
func TestEtcdQueueKeysAreReused(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	c := newClient(t, s)
	name := testenv.Name(t)
	queue := sequencer.NewKeyspace(prefix).QueuePrefix(name)
	wctx, stop := context.WithCancel(t.Context())
	defer stop()
	wch := cli.Watch(wctx, queue, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch // the watch is set up
	const contenders, rounds = 6, 30
	var (
		wg     sync.WaitGroup
		failed atomic.Int32
	)
	for i := range contenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := c.Acquire(t.Context(), name, 5*time.Second, lock.WithWait(30*time.Second))
				if err != nil {
					t.Errorf("contender %d: %v", i, err)
					failed.Add(1)
					return
				}
				if err := l.Release(t.Context()); err != nil {
					t.Errorf("contender %d: release: %v", i, err)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		return
	}
	// Every queue key written, seen through the watch until it is quiet
	// up to the current revision.
	end, err := cli.Get(t.Context(), queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	// A progress notification carries the current revision even when no
	// queue key changed since the last event.
	if err := cli.RequestProgress(wctx); err != nil {
		t.Fatal(err)
	}
	keys, joins := map[string]bool{}, 0
	for wr := range wch {
		for _, ev := range wr.Events {
			keys[string(ev.Kv.Key)] = true
			if ev.Type == clientv3.EventTypePut && ev.IsCreate() {
				joins++
			}
		}
		if wr.Header.Revision >= end.Header.Revision {
			break
		}
	}
	if joins < contenders {
		t.Fatalf("%d queue joins in %d acquisitions by %d contenders: the test did not make waiters queue", joins, contenders*rounds, contenders)
	}
	if len(keys) > contenders {
		t.Fatalf("%d distinct queue keys for %d joins by %d contenders: want a store's waiters to reuse at most %d", len(keys), joins, contenders, contenders)
	}
	t.Logf("%d joins on %d keys", joins, len(keys))
}

// A fair waiter keeps its place for as long as it waits, even when its
// store holds no lock: the place's key is on the store's session, which
// the store renewed only while locks were held on it. Before, a wait
// longer than the session's TTL (twice the lock's) lost the place with the
// session, and the waiter queued again behind those who came after it.
func TestEtcdLongWaitKeepsItsPlace(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	store := func() *lock.Client { return newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))) }
	holder, first, second := store(), store(), store()
	name := testenv.Name(t)
	h, err := holder.Acquire(t.Context(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 2)
	wait := func(c *lock.Client, who string, ttl time.Duration) {
		l, err := c.Acquire(t.Context(), name, ttl, lock.WithWait(30*time.Second))
		if err != nil {
			t.Errorf("%s: %v", who, err)
			got <- who
			return
		}
		got <- who
		if err := l.Release(context.Background()); err != nil {
			t.Errorf("%s: release: %v", who, err)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { wait(first, "first", 2*time.Second) }) // a session of 4 s
	testenv.WaitUntil(t, 30*time.Second, func() bool { st, err := holder.Inspect(t.Context(), name); return err == nil && st.Waiters == 1 })
	wg.Go(func() { wait(second, "second", 30*time.Second) })
	testenv.WaitUntil(t, 30*time.Second, func() bool { st, err := holder.Inspect(t.Context(), name); return err == nil && st.Waiters == 2 })
	// Not a synchronisation: the property is a place that outlives the
	// first session lease its waiter's store granted (4 s, and etcd's
	// lessor revokes within 0.5 s after).
	time.Sleep(6 * time.Second)
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if w := <-got; w != "first" {
		t.Fatalf("the lock went to the %s waiter first; want the first, who waited longer", w)
	}
}

// A place whose Leave could not reach etcd does not block the queue: the
// store deletes its key later. Before, the key stood ahead of every fair
// waiter of the lock, in every process, for as long as the store's session
// lived, and a store that holds locks keeps its session alive.
func TestEtcdFailedLeaveDoesNotBlockTheQueue(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	a := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	holder := newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix)))
	other := newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix)))
	name := testenv.Name(t)
	// a keeps its session in use with a lock of the same TTL.
	kept, err := newClient(t, a).Acquire(t.Context(), testenv.Name(t)+"-kept", 5*time.Second, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Release(context.Background())
	h, err := holder.Acquire(t.Context(), name, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: "0123456789abcdef0123456789abcdef",
		TTL: 5 * time.Second, Waiter: "fedcba9876543210fedcba9876543210", WaiterTTL: lock.DefaultWaiterTTL})
	var held *lock.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("a waiter's attempt on a held lock: %v, want a HeldError", err)
	}
	gone, cancel := context.WithCancel(t.Context())
	cancel() // the delete cannot reach etcd
	if err := a.Leave(gone, name, "fedcba9876543210fedcba9876543210"); err == nil {
		t.Fatal("Leave with a cancelled context succeeded")
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	getsIt(t, other, name, lock.WithWait(3*time.Second), "a fair waiter behind the place that failed to leave")
}

// A fair waiter whose store's session expired unnoticed (revoked here, as
// a long pause past its TTL would) joins the queue on the fresh session
// the store gets. Before, the store moved the lock's create onto the fresh
// session but not the queue key, and the Txn failed again: the waiter got
// an error, and so did every other caller batched with it.
func TestEtcdWaiterJoinsOnAFreshSession(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	ks := sequencer.NewKeyspace(prefix)
	a := newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix)))
	holder := newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix)))
	name, other := testenv.Name(t), testenv.Name(t)
	// a's session: the lease of the lock a holds.
	mine, err := a.Acquire(t.Context(), other, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(t.Context(), ks.LockKey(other))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("a's lock in etcd: %v, %v", r, err)
	}
	if _, err := cli.Revoke(t.Context(), clientv3.LeaseID(r.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	h, err := holder.Acquire(t.Context(), name, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := a.Acquire(context.Background(), name, 5*time.Second, lock.WithWait(20*time.Second))
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		select {
		case err := <-got:
			t.Fatalf("the waiter ended before the lock was released: %v", err)
		default:
		}
		st, err := holder.Inspect(t.Context(), name)
		return err == nil && st.Waiters == 1
	})
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter on a fresh session: %v", err)
	}
	_ = mine.Release(t.Context()) // lost with the session
}

// A create whose reply was lost, and whose release then failed too (etcd
// out of reach for a while), is released once etcd answers again. Before,
// the store tried the release once: the lock, held by nobody, stayed for
// as long as the store's session lived, and a store that holds other
// locks keeps its session alive.
func TestEtcdLostCreateIsReleasedWhenEtcdAnswers(t *testing.T) {
	t.Parallel()
	pr, a, other := behindProxy(t, 10*time.Second)
	// The proxy cuts the connection at the first bytes etcd sends after
	// the create went through it, and on a connection that carries other
	// streams too (the session's keep-alive, the issuer's watch) those may
	// come first and cut the create before etcd commits it. That is no
	// lost reply: try again, on a new name, until the create committed.
	var name string
	for try := 1; ; try++ {
		name = testenv.Name(t)
		lost := pr.LoseReplyAndRefuse([]byte(name))
		if _, err := a.TryAcquire(t.Context(), name, 10*time.Second); err == nil {
			t.Fatal("an acquisition whose reply was lost succeeded")
		}
		<-lost
		st, err := other.Inspect(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held {
			break
		}
		if try == 5 {
			t.Fatalf("in %d tries, the create whose reply was lost never committed: %+v", try, st)
		}
		pr.Refuse(false)
	}
	// Not a synchronisation: the fault is an etcd out of reach for 6 s,
	// longer than the store's first try to release waits (5 s).
	time.Sleep(6 * time.Second)
	pr.Refuse(false)
	getsIt(t, other, name, lock.WithWait(8*time.Second), "the lock nobody holds")
}

// A lock whose deadline passed while etcd was out of reach is deleted once
// etcd answers again. Before, the store tried once (for 10 s) and then
// left it to the session lease, which the store's other locks keep alive:
// the lock, held by nobody, stayed for as long as the process ran.
func TestEtcdExpiryOutlastsAnOutage(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second // a session of 20 s, which outlives the outage
	pr, a, other := behindProxy(t, ttl)
	name := testenv.Name(t)
	if _, err := a.Acquire(t.Context(), name, ttl); err != nil { // never refreshed
		t.Fatal(err)
	}
	// Not a synchronisation: the fault is etcd out of reach from just
	// before the deadline until past the store's first try to delete the
	// lock (10 s), about as long as the session survives.
	time.Sleep(ttl - time.Second)
	pr.Refuse(true)
	pr.CutAll()
	time.Sleep(12 * time.Second)
	pr.Refuse(false)
	getsIt(t, other, name, lock.WithWait(8*time.Second), "the expired lock")
}

// behindProxy is a client of a store that reaches etcd through a fault
// proxy, keeping its session in use with a kept-alive lock of ttl, and a
// client of another store that reaches etcd directly.
func behindProxy(t *testing.T, ttl time.Duration) (*faultproxy.Proxy, *lock.Client, *lock.Client) {
	t.Helper()
	e, direct := testenv.Etcd(t)
	pr, cli := testenv.EtcdThroughProxy(t, e)
	prefix := "/" + testenv.Name(t) + "/"
	a := newClient(t, newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix)))
	other := newClient(t, newEtcdStore(t, direct, lock.WithEtcdPrefix(prefix)))
	kept, err := a.Acquire(t.Context(), testenv.Name(t), ttl, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kept.Release(context.Background()) })
	return pr, a, other
}

// getsIt checks that c acquires name (within the wait opt allows), and
// releases it.
func getsIt(t *testing.T, c *lock.Client, name string, opt lock.Option, what string) {
	t.Helper()
	l, err := c.Acquire(t.Context(), name, 5*time.Second, opt)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
