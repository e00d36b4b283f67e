package lock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// inAbandon is the code of the etcd store's abandons, for
// testenv.GoroutinesIn.
const inAbandon = "lock.(*EtcdStore).abandon"

// attempts wraps a store and counts the attempts to acquire that reach it.
type attempts struct {
	lock.LeaseStore
	n atomic.Int64
}

func (a *attempts) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	a.n.Add(1)
	return a.LeaseStore.Acquire(ctx, req)
}

// marks reads the abandoned marks under prefix, and the etcd leases they
// are on.
func marks(t *testing.T, cli *clientv3.Client, prefix string) (n int, leases map[clientv3.LeaseID]int) {
	t.Helper()
	r, err := cli.Get(t.Context(), prefix+"abandoned/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	leases = map[clientv3.LeaseID]int{}
	for _, kv := range r.Kvs {
		leases[clientv3.LeaseID(kv.Lease)]++
	}
	return len(r.Kvs), leases
}

// queueWaiters starts n fair waiters of name on c, each waiting up to a
// minute, and returns once all of them are queued. The leases granted to
// them arrive on granted; stop ends the others' waits and waits for them
// (so does the test's end).
func queueWaiters(t *testing.T, c *lock.Client, name string, n int) (granted <-chan *lock.Lease, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	out := make(chan *lock.Lease, n)
	for range n {
		wg.Go(func() {
			if l, err := c.Acquire(ctx, name, time.Minute, lock.WithWait(time.Minute)); err == nil {
				out <- l
			}
		})
	}
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := c.Inspect(t.Context(), name)
		return err == nil && st.Waiters == n
	})
	return out, stop
}

// Defect 212: an attempt that every member refused for want of a leader
// ran nothing, and is not abandoned. Three members, a holder, 20 fair
// waiters that ride out the loss of two members with an attempt every
// backoff. Before, each failed attempt started a goroutine that tried,
// until etcd answered, to mark and release it, and then left a mark on an
// etcd lease of its own for a minute: hundreds of each in a few seconds.
// Now only attempts etcd may have run (those in flight when the quorum
// went, which time out) are abandoned.
func TestEtcdAttemptsRefusedForWantOfALeaderAreNotAbandoned(t *testing.T) {
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.EtcdClient(t, members[0].ClientURL())
	prefix := "/" + testenv.Name(t) + "/"
	cnt := &attempts{LeaseStore: newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))}
	c := newClient(t, cnt)
	ctx := t.Context()
	name := testenv.Name(t)
	if _, err := c.Acquire(ctx, name, time.Minute); err != nil {
		t.Fatal(err)
	}
	const waiters = 20
	_, stop := queueWaiters(t, c, name, waiters)
	leasesBefore, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	members[1].Close()
	members[2].Close()
	// Ten failed attempts a waiter, at one every 256 ms at most.
	from := cnt.n.Load()
	most := 0
	testenv.WaitUntil(t, 60*time.Second, func() bool {
		most = max(most, len(testenv.GoroutinesIn(inAbandon)))
		return cnt.n.Load() >= from+10*waiters
	})
	stop()
	most = max(most, len(testenv.GoroutinesIn(inAbandon)))

	members[1] = testenv.Restart(t, members, 1)
	testenv.WaitUntil(t, 30*time.Second, func() bool { return testenv.Leader(members[:2]) != nil })
	testenv.WaitUntil(t, 30*time.Second, func() bool { return len(testenv.GoroutinesIn(inAbandon)) == 0 })
	n, _ := marks(t, cli, prefix)
	leasesAfter, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d attempts over the lost quorum: up to %d goroutines abandoning; %d marks; etcd leases %d -> %d",
		cnt.n.Load()-from, most, n, len(leasesBefore.Leases), len(leasesAfter.Leases))
	// Each waiter has one attempt in flight at a time: at most that one,
	// when the quorum went, and one when it gave up may have run.
	if n > 2*waiters || most > 2*waiters {
		t.Errorf("%d waiters over a lost quorum: %d abandoned marks, up to %d goroutines abandoning; want at most %d",
			waiters, n, most, 2*waiters)
	}
}

// Defect 212: abandons while etcd is out of reach are bounded, and none
// is dropped. A store cut off from etcd fails 100 attempts that etcd may
// have run (their calls timed out): at most MaxAbandonsRetrying goroutines
// abandon them at once (before, one each), and once etcd answers again
// every one of them is marked, on a few etcd leases (before, a lease
// each), each mark lasting at least AbandonedFor.
func TestEtcdAbandonsWhileEtcdIsOutOfReachAreBounded(t *testing.T) {
	e, direct := testenv.Etcd(t)
	p, cli := testenv.EtcdThroughProxy(t, e)
	prefix := "/" + testenv.Name(t) + "/"
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	ctx := t.Context()
	const ttl = 10 * time.Second
	// A lock of the same TTL: the attempts find their session granted.
	if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: testenv.Name(t), LeaseID: fmt.Sprintf("%032x", 1), TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	p.CutAll()
	const attempts = 100
	var wg sync.WaitGroup
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			req := lock.AcquireRequest{Name: fmt.Sprint(testenv.Name(t), "-", i), LeaseID: fmt.Sprintf("%032x", 2+i), TTL: ttl}
			if _, err := s.Acquire(actx, req); err == nil {
				t.Errorf("acquired %s with etcd out of reach", req.Name)
			}
		}()
	}
	wg.Wait()
	// Each failed attempt has called abandon by now.
	if n := len(testenv.GoroutinesIn(inAbandon)); n > lock.MaxAbandonsRetrying {
		t.Errorf("%d attempts failed with etcd out of reach: %d goroutines abandon them, want at most %d", attempts, n, lock.MaxAbandonsRetrying)
	}
	p.Refuse(false)
	healed := time.Now()
	testenv.WaitUntil(t, 60*time.Second, func() bool { return len(testenv.GoroutinesIn(inAbandon)) == 0 })
	took := time.Since(healed)
	n, leases := marks(t, direct, prefix)
	t.Logf("%d abandons done %s after etcd answered again: %d marks on %d etcd leases", attempts, took.Round(time.Millisecond), n, len(leases))
	if n != attempts {
		t.Errorf("%d abandoned attempts left %d marks", attempts, n)
	}
	if most := int(took/lock.MarkReuse) + 2; len(leases) > most {
		t.Errorf("%d marks made in %s on %d etcd leases, want at most %d (one per %s)", n, took, len(leases), most, lock.MarkReuse)
	}
	for id := range leases {
		if id == 0 {
			t.Errorf("a mark on no lease")
			continue
		}
		l, err := direct.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// Whole seconds, rounded down.
		if left := time.Duration(l.TTL+1) * time.Second; left < lock.AbandonedFor-time.Since(healed) {
			t.Errorf("a mark made at most %s ago is on a lease with %s left: it lasts less than %s", time.Since(healed), left, lock.AbandonedFor)
		}
	}
}

// Defect 213: fair waiters on a held lock, nobody acquiring or releasing,
// write nothing to etcd. Before, every batch with a create put the
// counter key, whether or not a create took its lock, and each waiter
// attempts every backoff (256 ms at most): 50 waiters made 2,200
// revisions of history in 10 s. The first grant after the holder's release
// still writes the counter at its token's revision, so that issuers
// following it know the token (guarantee 4).
func TestEtcdWaitersOnAHeldLockWriteNothing(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	cnt := &attempts{LeaseStore: newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))}
	c := newClient(t, cnt)
	ctx := t.Context()
	name := testenv.Name(t)
	holder, err := c.Acquire(ctx, name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 20
	granted, _ := queueWaiters(t, c, name, waiters)
	r0, err := cli.Get(ctx, prefix+"counter")
	if err != nil {
		t.Fatal(err)
	}
	from := cnt.n.Load()
	testenv.WaitUntil(t, 60*time.Second, func() bool { return cnt.n.Load() >= from+10*waiters })
	r1, err := cli.Get(ctx, prefix+"counter")
	if err != nil {
		t.Fatal(err)
	}
	revs := r1.Header.Revision - r0.Header.Revision
	t.Logf("%d attempts of %d waiters on a held lock: %d revisions", cnt.n.Load()-from, waiters, revs)
	if revs != 0 {
		t.Errorf("waiters on a held lock made %d revisions in %d attempts", revs, cnt.n.Load()-from)
	}

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := testenv.Next(t, granted)
	defer next.Release(ctx)
	if next.Token() <= holder.Token() {
		t.Fatalf("the next holder's token %d is not above %d", next.Token(), holder.Token())
	}
	lk, err := cli.Get(ctx, sequencer.NewKeyspace(prefix).LockKey(name))
	if err != nil || len(lk.Kvs) != 1 {
		t.Fatalf("read the lock: %v, %v", lk, err)
	}
	ctr, err := cli.Get(ctx, prefix+"counter")
	if err != nil || len(ctr.Kvs) != 1 {
		t.Fatalf("read the counter: %v, %v", ctr, err)
	}
	if ctr.Kvs[0].ModRevision < lk.Kvs[0].CreateRevision {
		t.Errorf("the grant at revision %d wrote no counter (last written at %d)", lk.Kvs[0].CreateRevision, ctr.Kvs[0].ModRevision)
	}
}

// Defect 213: every grant still writes the counter key, at its token's
// revision, when its create shares a batch with creates that find their
// locks held: a batch writes the counter unless every lock in it is taken.
// Issuers following the counter (sequencer.Issuer.Follow) learn every
// token so; one a grant did not write would go unseen by the check that
// etcd did not go back in time.
func TestEtcdEveryGrantWritesTheCounter(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix(prefix))
	c := newClient(t, s)
	ctx := t.Context()
	base := testenv.Name(t)
	const names = 16
	// Every other name is held throughout: attempts on them share batches
	// with the grants of the others.
	for i := 0; i < names; i += 2 {
		if _, err := c.Acquire(ctx, fmt.Sprint(base, "-", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	from, err := cli.Get(ctx, prefix+"counter")
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	events := cli.Watch(wctx, prefix+"counter", clientv3.WithRev(from.Header.Revision+1))

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		tokens []fence.Token
	)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				l, err := c.TryAcquire(ctx, fmt.Sprint(base, "-", (w+i)%names), time.Minute)
				if err != nil {
					continue // held
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	floor, err := sequencer.ReadFloor(ctx, cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	to, err := cli.Get(ctx, prefix+"counter")
	if err != nil || len(to.Kvs) != 1 {
		t.Fatalf("read the counter: %v, %v", to, err)
	}
	written := map[fence.Token]bool{}
	for seen := int64(0); seen < to.Kvs[0].ModRevision; {
		wr, ok := <-events
		if !ok {
			t.Fatalf("the watch of the counter ended: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			written[sequencer.Token(ev.Kv.ModRevision, floor.Offset)] = true
			seen = ev.Kv.ModRevision
		}
	}
	for _, tok := range tokens {
		if !written[tok] {
			t.Errorf("token %d was granted with no write of the counter at its revision", tok)
		}
	}
	t.Logf("%d grants beside attempts on held locks, each with its counter write", len(tokens))
}
