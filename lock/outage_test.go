package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// failSignal wraps a store and reports the first Acquire that failed other
// than with ErrNotAcquired: the backend was down for that attempt.
type failSignal struct {
	lock.LeaseStore
	failed   chan error
	once     sync.Once
	attempts atomic.Int64
}

func newFailSignal(s lock.LeaseStore) *failSignal {
	return &failSignal{LeaseStore: s, failed: make(chan error, 1)}
}

func (f *failSignal) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	f.attempts.Add(1)
	g, err := f.LeaseStore.Acquire(ctx, req)
	if err != nil && !errors.Is(err, lock.ErrNotAcquired) {
		f.once.Do(func() { f.failed <- err })
	}
	return g, err
}

// acquired is the outcome of an Acquire run in a goroutine.
type acquired struct {
	l   *lock.Lease
	err error
}

func acquireAsync(ctx context.Context, c *lock.Client, name string, opts ...lock.Option) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, name, 5*time.Second, opts...)
		ch <- acquired{l, err}
	}()
	return ch
}

// redisStore is a Redis lease store on rdb, its acquisitions counted.
func redisStore(t *testing.T, rdb *redis.Client) *failSignal {
	t.Helper()
	s, err := lock.NewRedisStore(rdb, newSequencer(t), lock.WithRedisPrefix(testenv.Name(t)+":"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return newFailSignal(s)
}

// redisBehindProxy is a Redis lease store whose Redis is reached through a
// fault proxy.
func redisBehindProxy(t *testing.T) (*faultproxy.Proxy, *failSignal) {
	t.Helper()
	pr, err := faultproxy.New(testenv.RedisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: pr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return pr, redisStore(t, rdb)
}

// TestAcquireRidesOutARedisOutage: Redis refuses connections when an
// acquisition with a wait budget begins, and takes them again after its
// first attempt failed. The acquisition waits it out and gets the lock, as
// it would wait for a holder; before, it failed with the first attempt's
// connection error.
func TestAcquireRidesOutARedisOutage(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{true, false} {
		t.Run(map[bool]string{true: "fair", false: "unfair"}[fair], func(t *testing.T) {
			pr, s := redisBehindProxy(t)
			c := newClient(t, s)
			pr.Refuse(true)
			opts := []lock.Option{lock.WithWait(30 * time.Second)}
			if !fair {
				opts = append(opts, lock.WithUnfair())
			}
			res := acquireAsync(t.Context(), c, testenv.Name(t), opts...)
			first := testenv.Next(t, s.failed)
			var be *lock.BackendError
			if !errors.As(first, &be) || be.Backend != "redis" {
				t.Fatalf("the attempt while Redis refused: %v, want a Redis backend error", first)
			}
			pr.Refuse(false)
			r := testenv.Next(t, res)
			if r.err != nil {
				t.Fatalf("acquire across a Redis outage of one attempt: %v", r.err)
			}
			if r.l.Token() == 0 {
				t.Fatal("granted without a token")
			}
			if err := r.l.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAcquireRidesOutAnEtcdElection: two of three etcd members are down,
// so the one the store talks to has no leader and answers "no leader".
// An acquisition with a wait budget that meets that answer keeps trying,
// and gets the lock once a member is back and a leader elected; before, it
// failed with etcd's "no leader".
func TestAcquireRidesOutAnEtcdElection(t *testing.T) {
	t.Parallel() // a quorum to lose and regain: a few seconds
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.EtcdClient(t, members[0].ClientURL())
	s := newFailSignal(newEtcdStore(t, cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/")))
	c := newClient(t, s)
	members[1].Close()
	members[2].Close()
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		st, err := cli.Status(t.Context(), members[0].ClientURL())
		return err == nil && st.Leader == 0
	})
	res := acquireAsync(t.Context(), c, testenv.Name(t), lock.WithWait(60*time.Second))
	if first := testenv.Next(t, s.failed); !strings.Contains(first.Error(), "no leader") {
		t.Fatalf("the attempt without a quorum: %v, want etcd's no leader", first)
	}
	testenv.Restart(t, members, 1)
	r := testenv.Next(t, res)
	if r.err != nil {
		t.Fatalf("acquire across an etcd election: %v", r.err)
	}
	if err := r.l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireOutageEndsWithTheBudget: while Redis stays down, an
// acquisition with a wait budget ends when the budget does, with the
// backend's error (a 503 over HTTP), not a WaitError: nobody was found
// holding the lock. One with neither a wait budget nor a context deadline
// fails at the first error, so that it cannot hang on a backend that is
// down; TryAcquire never retries.
func TestAcquireOutageEndsWithTheBudget(t *testing.T) {
	t.Parallel()
	pr, s := redisBehindProxy(t)
	c := newClient(t, s)
	pr.Refuse(true)
	name := testenv.Name(t)

	_, err := c.Acquire(t.Context(), name, 5*time.Second, lock.WithWait(1500*time.Millisecond))
	var be *lock.BackendError
	var we *lock.WaitError
	if !errors.As(err, &be) || errors.As(err, &we) || !strings.Contains(err.Error(), "did not answer within the wait budget") {
		t.Fatalf("acquire while Redis stays down: %v, want the backend's error at the budget's end", err)
	}
	if n := s.attempts.Load(); n < 2 {
		t.Fatalf("%d attempts in the budget, want the outage retried", n)
	}

	for what, acq := range map[string]func() error{
		"Acquire without a deadline": func() error {
			_, err := c.Acquire(context.Background(), name, 5*time.Second)
			return err
		},
		"TryAcquire": func() error {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			_, err := c.TryAcquire(ctx, name, 5*time.Second)
			return err
		},
	} {
		before := s.attempts.Load()
		err := acq()
		if !errors.As(err, &be) || strings.Contains(err.Error(), "wait budget") {
			t.Fatalf("%s while Redis is down: %v, want the backend's error at once", what, err)
		}
		if n := s.attempts.Load() - before; n != 1 {
			t.Fatalf("%s made %d attempts, want 1", what, n)
		}
	}
}

// TestAcquireDoesNotRetryWhatWaitingCannotFix: a backend that answers with
// an error of its own (here a Redis out of memory, which refuses every
// write until an operator acts) fails the acquisition at once, wait budget
// or not: only a backend that is unavailable is waited out.
func TestAcquireDoesNotRetryWhatWaitingCannotFix(t *testing.T) {
	r := testenv.StartRedis(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	s := redisStore(t, r.Client())
	c := newClient(t, s)
	_, err := c.Acquire(t.Context(), testenv.Name(t), 5*time.Second, lock.WithWait(time.Minute))
	if !redis.IsOOMError(err) || strings.Contains(err.Error(), "wait budget") {
		t.Fatalf("acquire on a Redis out of memory: %v, want its OOM error at once", err)
	}
	if n := s.attempts.Load(); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

// TestLostJoinLeavesTheQueue: a fair acquisition whose attempt joined a
// held lock's queue in Redis and never heard so (the reply lost, Redis then
// refusing connections) ended with the connection's error, and its place
// stayed ahead of every later waiter until it expired (the waiter TTL,
// 3 s): once released, the lock went to nobody meanwhile. The client now
// gives such a place up off the caller's path, trying until Redis answers
// or the place would have expired anyway.
func TestLostJoinLeavesTheQueue(t *testing.T) {
	t.Parallel()
	pr := newProxiedRedis(t)
	lost := newClient(t, pr.store)
	ds, err := lock.NewRedisStore(pr.direct, pr.seq, lock.WithRedisPrefix(pr.prefix)) // the same locks, straight
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	direct := newClient(t, ds)
	ctx, name := t.Context(), testenv.Name(t)
	holder, err := direct.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cut := pr.proxy.LoseReplyAndRefuse([]byte(name))
	if _, err := lost.Acquire(ctx, name, 30*time.Second); err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("acquire whose reply was lost: %v, want the connection's error", err)
	}
	<-cut
	if st, err := direct.Inspect(ctx, name); err != nil || st.Waiters != 1 {
		t.Fatalf("queue after the lost join: %+v, %v; want its place (1 waiter)", st, err)
	}
	pr.proxy.Refuse(false) // Redis answers again, well within the place's 3 s
	testenv.WaitUntil(t, 2*time.Second, func() bool {
		st, err := direct.Inspect(ctx, name)
		return err == nil && st.Waiters == 0
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := direct.Acquire(ctx, name, 30*time.Second, lock.WithWait(2*time.Second))
	if err != nil {
		t.Fatalf("a waiter after the release: %v; the lost join's place kept the lock from it", err)
	}
	next.Release(ctx)
}

// TestEtcdWatchEndedByAnElectionIsRenewed: a waiter's etcd watch ends when
// etcd loses its leader (the watch requires one). The waiter must then
// subscribe again: behind the head it attempts only once a second, and
// with its watch gone nothing woke it when the place ahead went and the
// lock was released; it found the free lock at its next attempt, up to a
// second later (docs/design.md, defect 251).
func TestEtcdWatchEndedByAnElectionIsRenewed(t *testing.T) {
	t.Parallel() // a quorum to lose and regain: a few seconds
	members := testenv.EtcdCluster(t, 3)
	cli := testenv.EtcdClient(t, members[0].ClientURL())
	s := newEtcdStore(t, cli, lock.WithEtcdPrefix("/"+testenv.Name(t)+"/"))
	name, ctx := testenv.Name(t), t.Context()
	holder, head := newID(t), newID(t)
	if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: holder, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: time.Second, Waiter: head, WaiterTTL: lock.DefaultWaiterTTL}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the head joins: %v", err)
	}
	counted := &attemptCounter{LeaseStore: s, ws: map[string]*waiterSeen{}}
	got := make(chan time.Time, 1)
	go func() {
		l, err := newClient(t, counted).Acquire(context.Background(), name, 5*time.Second, lock.WithWait(time.Minute))
		got <- time.Now()
		if err != nil {
			t.Errorf("the waiter behind: %v", err)
			return
		}
		_ = l.Release(context.Background())
	}()
	behind := func() bool { ws := counted.attempts(); return len(ws) == 1 && ws[0].n >= 3 && ws[0].pos == 2 }
	testenv.WaitUntil(t, 30*time.Second, behind)

	// An election: etcd ends the watches that require a leader once it
	// has had none for a few election timeouts (a probe of its own shows
	// when); then it has one again.
	probe, stopProbe, err := s.Watch(ctx, name, "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopProbe()
	members[1].Close()
	members[2].Close()
	select {
	case <-probe:
	case <-time.After(60 * time.Second):
		t.Fatal("etcd without a leader for a minute kept the watches that require one")
	}
	testenv.Restart(t, members, 1)
	n := counted.attempts()[0].n
	testenv.WaitUntil(t, 30*time.Second, func() bool { return counted.attempts()[0].n > n && behind() })

	// Just after one of its attempts, the head leaves and the lock is
	// released: each woke the waiter at once through its watch.
	n = counted.attempts()[0].n
	testenv.WaitUntil(t, 10*time.Second, func() bool { return counted.attempts()[0].n > n })
	if err := s.Leave(ctx, name, head); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := s.Release(ctx, name, holder, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		if late := at.Sub(released); late > 500*time.Millisecond {
			t.Fatalf("the waiter got the lock %s after its release: its watch, ended by the election, was not renewed", late.Round(time.Millisecond))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter never got the lock")
	}
}
