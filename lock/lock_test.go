package lock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
)

// backend is one lease store under test, with a way to tamper with it
// behind the holder's back.
type backend struct {
	name  string
	store lock.LeaseStore
	ttl   time.Duration // a short TTL the store honours
	// deleteLease removes the lease of name directly in the backend.
	deleteLease func(t *testing.T, name string)
}

func backends(t *testing.T) []backend {
	return []backend{redisBackend(t), etcdBackend(t)}
}

// everyStore is backends and a Redlock of three Redis servers: for what
// all the stores must do alike.
func everyStore(t *testing.T) []backend {
	_, redlock := startRedlock(t)
	return append(backends(t), backend{name: "redlock", store: redlock})
}

func redisBackend(t testing.TB) backend {
	rdb := testenv.Redis(t)
	_, cli := testenv.Etcd(t)
	seq, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	prefix := testenv.Name(t) + ":"
	s, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return backend{
		name: "redis", store: s, ttl: 300 * time.Millisecond,
		deleteLease: func(t *testing.T, name string) {
			if n, err := rdb.Del(context.Background(), prefix+"{"+name+"}:lease").Result(); err != nil || n != 1 {
				t.Fatalf("delete lease key: %d, %v", n, err)
			}
		},
	}
}

func etcdBackend(t testing.TB) backend {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	s, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return backend{
		name: "etcd", store: s, ttl: 2 * time.Second,
		deleteLease: func(t *testing.T, name string) {
			if r, err := cli.Delete(context.Background(), prefix+"locks/"+name); err != nil || r.Deleted != 1 {
				t.Fatalf("delete lock key: %v", err)
			}
		},
	}
}

func newClient(t testing.TB, s lock.LeaseStore) *lock.Client {
	c, err := lock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.Close(ctx) // a test that killed its Redis cannot release; don't wait for it
	})
	return c
}

// watchSignal wraps a store and reports when a waiter's Watch has returned.
type watchSignal struct {
	lock.LeaseStore
	watching chan struct{}
	once     sync.Once
}

func (w *watchSignal) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	ch, stop, err := w.LeaseStore.Watch(ctx, name, waiter)
	w.once.Do(func() { close(w.watching) })
	return ch, stop, err
}

// counting wraps a store and counts every call that reaches it.
type counting struct {
	lock.LeaseStore
	calls atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	c.calls.Add(1)
	return c.LeaseStore.Acquire(ctx, req)
}

func (c *counting) Inspect(ctx context.Context, name string) (lock.State, error) {
	c.calls.Add(1)
	return c.LeaseStore.Inspect(ctx, name)
}

func (c *counting) Watch(ctx context.Context, name, waiter string) (<-chan struct{}, func(), error) {
	c.calls.Add(1)
	return c.LeaseStore.Watch(ctx, name, waiter)
}

func TestMutualExclusionUnderContention(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			const workers, rounds = 8, 15
			var (
				holders  atomic.Int32
				counter  int           // unsynchronised on purpose: -race sees overlap
				tokens   []fence.Token // in the order holders held the lock
				wg       sync.WaitGroup
				failures = make(chan error, workers)
			)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < rounds; i++ {
						l, err := c.Acquire(context.Background(), name, 10*b.ttl, lock.WithWait(30*time.Second))
						if err != nil {
							failures <- err
							return
						}
						if n := holders.Add(1); n != 1 {
							failures <- fmt.Errorf("%d holders at once", n)
						}
						counter++
						tokens = append(tokens, l.Token())
						holders.Add(-1)
						if err := l.Release(context.Background()); err != nil {
							failures <- fmt.Errorf("release: %w", err)
						}
					}
				}()
			}
			wg.Wait()
			close(failures)
			for err := range failures {
				t.Fatal(err)
			}
			if counter != workers*rounds {
				t.Fatalf("counter = %d, want %d", counter, workers*rounds)
			}
			for i := 1; i < len(tokens); i++ {
				if tokens[i] <= tokens[i-1] {
					t.Fatalf("holder %d got token %d after %d", i, tokens[i], tokens[i-1])
				}
			}
		})
	}
}

func TestWaiterWakesOnRelease(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ws := &watchSignal{LeaseStore: b.store, watching: make(chan struct{})}
			c := newClient(t, ws)
			name := testenv.Name(t)
			const hold = 40 * time.Second
			a, err := c.Acquire(t.Context(), name, hold)
			if err != nil {
				t.Fatal(err)
			}
			type res struct {
				l   *lock.Lease
				err error
			}
			got := make(chan res, 1)
			go func() {
				// The fallback retry is an hour and the budget far below the
				// holder's TTL: only the release notification can wake it.
				l, err := c.Acquire(context.Background(), name, b.ttl, lock.WithRetry(lock.LinearBackoff(time.Hour)), lock.WithWait(hold/2))
				got <- res{l, err}
			}()
			<-ws.watching // Watch returns once Redis or etcd confirmed the subscription
			if err := a.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			if r.l.Token() <= a.Token() {
				t.Fatalf("waiter's token %d, want > %d", r.l.Token(), a.Token())
			}
			r.l.Release(t.Context())
		})
	}
}

func TestWrongLeaseIDCannotRefreshOrRelease(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			l, err := c.Acquire(t.Context(), name, 5*b.ttl)
			if err != nil {
				t.Fatal(err)
			}
			wrong := strings.Repeat("0", 32)
			if _, err := b.store.Refresh(t.Context(), name, wrong, b.ttl, 0); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("refresh with a wrong lease id: %v, want ErrLost", err)
			}
			if err := b.store.Release(t.Context(), name, wrong, ""); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("release with a wrong lease id: %v, want ErrLost", err)
			}
			st, err := c.Inspect(t.Context(), name)
			if err != nil || !st.Held || st.LeaseID != l.ID() || st.Token != l.Token() {
				t.Fatalf("after the wrong calls: %+v, %v; want held by %s with token %d", st, err, l.ID(), l.Token())
			}
			if err := l.Refresh(t.Context(), 0); err != nil {
				t.Fatalf("holder's refresh: %v", err)
			}
			if err := l.Release(t.Context()); err != nil {
				t.Fatalf("holder's release: %v", err)
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || st.Held {
				t.Fatalf("after release: %+v, %v", st, err)
			}
		})
	}
}

func TestDeletedLeaseReportedThroughDone(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			l, err := c.Acquire(t.Context(), name, b.ttl, lock.WithKeepAlive())
			if err != nil {
				t.Fatal(err)
			}
			b.deleteLease(t, name)
			<-l.Done()
			if err := l.Err(); !errors.Is(err, lock.ErrLost) || errors.Is(err, lock.ErrExpired) {
				t.Fatalf("Err = %v, want ErrLost from a refresh", err)
			}
			if err := l.Context().Err(); !errors.Is(err, context.Canceled) {
				t.Fatalf("lease context: %v", err)
			}
			if err := l.Release(t.Context()); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("Release of a lost lease = %v, want ErrLost", err)
			}
		})
	}
}

func TestKeepAliveHoldsPastTTL(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			l, err := c.Acquire(t.Context(), name, b.ttl, lock.WithKeepAlive())
			if err != nil {
				t.Fatal(err)
			}
			first := l.Deadline()
			// Wait until the keep-alive has moved the deadline past the
			// original one twice over; the lease must still be held.
			testenv.WaitUntil(t, 30*time.Second, func() bool { return l.Deadline().After(first.Add(b.ttl)) })
			select {
			case <-l.Done():
				t.Fatalf("lost: %v", l.Err())
			default:
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || st.LeaseID != l.ID() {
				t.Fatalf("inspect: %+v %v", st, err)
			}
			if err := l.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			<-l.Done()
			if !errors.Is(l.Err(), lock.ErrReleased) {
				t.Fatalf("Err after release = %v", l.Err())
			}
		})
	}
}

func TestExpiryWithoutRefresh(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			a, err := c.Acquire(t.Context(), name, b.ttl)
			if err != nil {
				t.Fatal(err)
			}
			if !a.Deadline().Before(time.Now().Add(a.TTL())) {
				t.Fatalf("deadline %v is not within the TTL", a.Deadline())
			}
			// The next holder waits for the expiry, not for a release.
			n, err := c.Acquire(t.Context(), name, b.ttl, lock.WithWait(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if n.Token() <= a.Token() {
				t.Fatalf("next holder's token %d, want > %d", n.Token(), a.Token())
			}
			<-a.Done()
			if !errors.Is(a.Err(), lock.ErrExpired) {
				t.Fatalf("first holder's Err = %v, want ErrExpired", a.Err())
			}
			if err := a.Refresh(t.Context(), 0); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("refresh of an expired lease: %v", err)
			}
			if err := a.Release(t.Context()); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("release of an expired lease: %v", err)
			}
			if st, _ := c.Inspect(t.Context(), name); st.LeaseID != n.ID() {
				t.Fatalf("the expired holder's release touched the new lease: %+v", st)
			}
			n.Release(t.Context())
		})
	}
}

func TestTryAcquireAndContextErrors(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			l, err := c.TryAcquire(t.Context(), name, 10*b.ttl)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background())
			if _, err := c.TryAcquire(t.Context(), name, b.ttl); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("TryAcquire of a held lock: %v", err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if _, err := c.Acquire(ctx, name, b.ttl); !errors.Is(err, context.Canceled) {
				t.Fatalf("Acquire with a cancelled context: %v", err)
			}
			ctx, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			if _, err := c.Acquire(ctx, name, b.ttl); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire past its deadline: %v", err)
			}
			if _, err := c.Acquire(t.Context(), name, b.ttl, lock.WithWait(50*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire past its wait budget: %v, want ErrNotAcquired", err)
			}
			if _, err := c.Acquire(t.Context(), name, b.ttl, lock.WithRetry(lock.LimitRetry(lock.LinearBackoff(time.Millisecond), 3))); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("Acquire with a limited retry: %v", err)
			}
		})
	}
}

func TestInvalidInputTouchesNoKey(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			cs := &counting{LeaseStore: b.store}
			c := newClient(t, cs)
			for _, name := range []string{"", "a b", "a/b", "{x}", "a\nb", "ä", strings.Repeat("x", 201), "*", ".", ".."} {
				if _, err := c.Acquire(t.Context(), name, time.Second); !errors.Is(err, lock.ErrInvalidName) {
					t.Errorf("name %q: %v, want ErrInvalidName", name, err)
				}
				if _, err := c.Inspect(t.Context(), name); !errors.Is(err, lock.ErrInvalidName) {
					t.Errorf("inspect %q: %v", name, err)
				}
			}
			// A TTL not in whole milliseconds was taken and cut by the Redis
			// store, the Lease saying what it was not (defect 199).
			for _, ttl := range []time.Duration{0, -time.Second, time.Millisecond, 25 * time.Hour, 10*time.Second + 900*time.Microsecond} {
				if _, err := c.TryAcquire(t.Context(), "ok-name", ttl); !errors.Is(err, lock.ErrInvalidTTL) || !strings.Contains(err.Error(), "want 10ms to 24h0m0s in whole milliseconds") {
					t.Errorf("ttl %s: %v, want ErrInvalidTTL saying what is allowed", ttl, err)
				}
			}
			if n := cs.calls.Load(); n != 0 {
				t.Fatalf("%d calls reached the store", n)
			}
			if err := lock.ValidateName("A-z_0.9:" + strings.Repeat("x", 192)); err != nil {
				t.Fatalf("a valid 200-character name: %v", err)
			}
			// The message names the byte, not a character it is not: "é"
			// is 0xc3 0xa9, and %q of 0xc3 alone showed 'Ã'.
			if err := lock.ValidateName("é"); err == nil || !strings.Contains(err.Error(), "byte 0xc3 (not ASCII) at byte 0") {
				t.Errorf("name %q: %v", "é", err)
			}
			// Only "." and ".." alone are path segments; dots elsewhere, and
			// prefixes of dots, are fine.
			for _, name := range []string{"...", ".a", "a..", "..b"} {
				if err := lock.ValidateName(name); err != nil {
					t.Errorf("name %q: %v", name, err)
				}
			}
			if err := errors.Join(lock.ValidateNamePrefix("."), lock.ValidateNamePrefix("..")); err != nil {
				t.Errorf("prefixes of dots: %v", err)
			}
		})
	}
}

func TestClientCloseReleasesLeases(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c, err := lock.New(b.store)
			if err != nil {
				t.Fatal(err)
			}
			name := testenv.Name(t)
			l, err := c.Acquire(t.Context(), name, b.ttl, lock.WithKeepAlive())
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Close(t.Context()); err != nil {
				t.Fatal(err)
			}
			<-l.Done()
			if st, err := b.store.Inspect(t.Context(), name); err != nil || st.Held {
				t.Fatalf("after Close: %+v %v", st, err)
			}
			if _, err := c.Acquire(t.Context(), name, b.ttl); !errors.Is(err, lock.ErrClosed) {
				t.Fatalf("Acquire after Close: %v", err)
			}
		})
	}
}

// heldTwice wraps a store and closes waiting when an attempt finds the
// lock held for the second time: the waiter has subscribed to releases and
// tried again, and is waiting for a release or its backoff.
type heldTwice struct {
	lock.LeaseStore
	held    atomic.Int32
	waiting chan struct{}
}

func (h *heldTwice) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	g, err := h.LeaseStore.Acquire(ctx, req)
	if errors.Is(err, lock.ErrNotAcquired) && h.held.Add(1) == 2 {
		close(h.waiting)
	}
	return g, err
}

// Close wakes an Acquire waiting for a lock another client holds, and
// returns after it: the Acquire returns ErrClosed, having left its place in
// the queue and taken nothing. Such an Acquire used to wait on for its next
// attempt (the holder's TTL or its backoff: here up to an hour; 1 s for a
// fair waiter), and only then see the client closed.
func TestCloseWakesWaitingAcquire(t *testing.T) {
	t.Parallel()
	waiter, err := lock.NewReleaseID() // any 32 hex digits
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range backends(t) {
		for _, w := range []struct {
			name string
			opts []lock.Option
		}{
			{"fair", nil},
			{"unfair", []lock.Option{lock.WithUnfair()}},
			{"kept place", []lock.Option{lock.WithWaiter(waiter)}},
		} {
			t.Run(b.name+"/"+w.name, func(t *testing.T) {
				name := testenv.Name(t)
				holder := newClient(t, b.store)
				l, err := holder.Acquire(t.Context(), name, 10*time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				hs := &heldTwice{LeaseStore: b.store, waiting: make(chan struct{})}
				c, err := lock.New(hs)
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					l, err := c.Acquire(t.Context(), name, time.Minute, append(w.opts, lock.WithRetry(lock.LinearBackoff(time.Hour)))...)
					if err == nil {
						err = fmt.Errorf("acquired %s, token %d", l.ID(), l.Token())
					}
					done <- err
				}()
				<-hs.waiting
				if err := c.Close(t.Context()); err != nil {
					t.Fatal(err)
				}
				// Close waited for the acquisition's end, which runs as
				// Acquire returns: its result is a few instructions away.
				select {
				case err := <-done:
					if !errors.Is(err, lock.ErrClosed) {
						t.Errorf("waiting Acquire: %v, want ErrClosed", err)
					}
				case <-time.After(500 * time.Millisecond):
					t.Error("Close returned with the Acquire still waiting")
					l.Release(t.Context()) // wakes it
					t.Fatalf("then, woken by the holder's release: %v", <-done)
				}
				st, err := b.store.Inspect(t.Context(), name)
				if err != nil || st.LeaseID != l.ID() || st.Waiters != 0 {
					t.Errorf("after Close: %+v, %v; want held by the holder, nobody waiting", st, err)
				}
			})
		}
	}
}

// TestEtcdTTLInMilliseconds: etcd leases are whole seconds, but the etcd
// store enforces each lock's own deadline, so a lock's TTL is honoured to
// the millisecond and the next holder gets it when it runs out.
func TestEtcdTTLInMilliseconds(t *testing.T) {
	b := etcdBackend(t)
	c := newClient(t, b.store)
	name := testenv.Name(t)
	l, err := c.Acquire(t.Context(), name, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 100*time.Millisecond {
		t.Fatalf("TTL %s, want the 100ms asked", l.TTL())
	}
	next, err := c.Acquire(t.Context(), name, time.Second, lock.WithWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(t.Context())
	select {
	case <-l.Done():
	default:
		t.Fatal("the next holder acquired while the first still believes it holds the lock")
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d after %d", next.Token(), l.Token())
	}
}

// lossySeq deletes the lease while the first token is being taken, as an
// expiry during a slow sequencer would.
type lossySeq struct {
	sequencer.Sequencer
	rdb    *redis.Client
	key    string
	calls  atomic.Int32
	tokens []fence.Token
	mu     sync.Mutex
}

func (s *lossySeq) Next(ctx context.Context, name string) (fence.Token, error) {
	tok, err := s.Sequencer.Next(ctx, name)
	if s.calls.Add(1) == 1 {
		s.rdb.Del(ctx, s.key)
	}
	s.mu.Lock()
	s.tokens = append(s.tokens, tok)
	s.mu.Unlock()
	return tok, err
}

func TestRedisLeaseLostWhileTakingToken(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	_, cli := testenv.Etcd(t)
	seq, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	prefix, name := testenv.Name(t)+":", "n"
	ls := &lossySeq{Sequencer: seq, rdb: rdb, key: prefix + "{n}:lease"}
	s, err := lock.NewRedisStore(rdb, ls, lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newClient(t, s)
	l, err := c.Acquire(t.Context(), name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ls.calls.Load() != 2 {
		t.Fatalf("sequencer called %d times, want 2 (the first token abandoned)", ls.calls.Load())
	}
	if l.Token() != ls.tokens[1] || l.Token() <= ls.tokens[0] {
		t.Fatalf("lease token %d, tokens taken %v", l.Token(), ls.tokens)
	}
	if st, _ := s.Inspect(t.Context(), name); st.Token != l.Token() {
		t.Fatalf("token recorded beside the lease: %d, want %d", st.Token, l.Token())
	}
}

func TestDetachedLeaseByID(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			l, err := c.Acquire(t.Context(), name, b.ttl, lock.WithDetached())
			if err != nil {
				t.Fatal(err)
			}
			want := 3 * b.ttl
			g, err := c.RefreshID(t.Context(), name, l.ID(), 3*b.ttl, 0)
			if err != nil || g.Token != l.Token() || g.TTL != want {
				t.Fatalf("RefreshID: %+v, %v; want token %d, ttl %s", g, err, l.Token(), want)
			}
			if _, err := c.RefreshID(t.Context(), name, "xyz", b.ttl, 0); !errors.Is(err, lock.ErrInvalidLeaseID) {
				t.Fatalf("malformed lease id: %v", err)
			}
			if err := c.ReleaseID(t.Context(), name, strings.Repeat("a", 32), ""); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("ReleaseID with another lease id: %v", err)
			}
			if err := c.ReleaseID(t.Context(), name, l.ID(), ""); err != nil {
				t.Fatal(err)
			}
			if _, err := c.RefreshID(t.Context(), name, l.ID(), b.ttl, 0); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("RefreshID after release: %v", err)
			}
		})
	}
}

// TestDownStoreIsNotHeld: when the store does not answer, a wait budget
// running out is the store's error, not ErrNotAcquired.
func TestDownStoreIsNotHeld(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	seq := newSequencer(t)
	s, err := lock.NewRedisStore(rdb, seq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := newClient(t, s)
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.Stop() // frozen: connections hang rather than fail
	defer r.Cont()
	_, err = c.Acquire(t.Context(), "down", time.Second, lock.WithWait(100*time.Millisecond))
	if err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Acquire against a frozen Redis: %v, want a store error", err)
	}
	if !strings.Contains(err.Error(), "did not answer within the wait budget") {
		t.Fatalf("error %v does not say the wait ran out", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping of a frozen Redis succeeded")
	}
}

// TestAdopt wraps a lease taken by another client (as a server hands one to
// a remote holder) and checks that it refreshes, is lost and is validated
// like one of this client's own.
func TestAdopt(t *testing.T) {
	t.Parallel()
	b := redisBackend(t)
	taker, holder := newClient(t, b.store), newClient(t, b.store)
	name := testenv.Name(t)
	start := time.Now()
	d, err := taker.Acquire(t.Context(), name, b.ttl, lock.WithDetached())
	if err != nil {
		t.Fatal(err)
	}
	l, err := holder.Adopt(t.Context(), name, d.ID(), lock.Grant{Token: d.Token(), TTL: d.TTL()}, start, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != d.Token() || l.ID() != d.ID() {
		t.Fatalf("adopted lease %s/%d, want %s/%d", l.ID(), l.Token(), d.ID(), d.Token())
	}
	first := l.Deadline()
	testenv.WaitUntil(t, 30*time.Second, func() bool { return l.Deadline().After(first.Add(b.ttl)) }) // kept alive
	b.deleteLease(t, name)
	<-l.Done()
	if !errors.Is(l.Err(), lock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
	if _, err := holder.Adopt(t.Context(), name, "nothex", lock.Grant{Token: 1, TTL: time.Second}, time.Now()); !errors.Is(err, lock.ErrInvalidLeaseID) {
		t.Fatalf("bad lease id: %v", err)
	}
	if _, err := holder.Adopt(t.Context(), name, d.ID(), lock.Grant{TTL: time.Second}, time.Now()); err == nil {
		t.Fatal("a grant with no token adopted")
	}
	if _, err := holder.Adopt(t.Context(), name, d.ID(), lock.Grant{Token: 1, TTL: time.Second}, time.Now().Add(-time.Hour)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a lease with no validity left: %v, want ErrNotAcquired", err)
	}
}

// hangingRefresh blocks every Refresh until its context ends, as a Redis
// that stopped answering would, and records how that context ended.
type hangingRefresh struct {
	lock.LeaseStore
	entered chan time.Time // the refresh context's deadline
	ended   chan error
}

func (h *hangingRefresh) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	d, _ := ctx.Deadline()
	h.entered <- d
	<-ctx.Done()
	h.ended <- ctx.Err()
	return lock.Grant{}, ctx.Err()
}

// TestReleaseInterruptsHungRefresh: Release must not wait for a keep-alive
// refresh stuck on a backend that does not answer; it would otherwise wait
// until the lease's deadline, which may be a day away.
func TestReleaseInterruptsHungRefresh(t *testing.T) {
	t.Parallel()
	b := redisBackend(t)
	h := &hangingRefresh{LeaseStore: b.store, entered: make(chan time.Time, 1), ended: make(chan error, 1)}
	c := newClient(t, h)
	l, err := c.Acquire(t.Context(), testenv.Name(t), 3*time.Second, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	// The keep-alive's refresh, at TTL/3, is hanging. Its context carries
	// the end of its attempt, half the time left to the lease's deadline
	// (defect 108), for the store's calls to pass on.
	if d := <-h.entered; !d.After(time.Now()) || !d.Before(l.Deadline()) {
		t.Errorf("the refresh's context has deadline %v; want one ahead and before the lease's, %v", d, l.Deadline())
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-h.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the hung refresh ended with %v: Release waited for the lease deadline instead of stopping it", err)
	}
}

// deafRefresh blocks every Refresh until unblock is closed, whatever its
// context says, as a store whose call is stuck in a shared batch does.
type deafRefresh struct {
	lock.LeaseStore
	entered chan struct{}
	unblock chan struct{}
}

func (d *deafRefresh) Refresh(ctx context.Context, name, id string, ttl time.Duration, seq uint64) (lock.Grant, error) {
	select {
	case d.entered <- struct{}{}:
	default:
	}
	<-d.unblock
	return lock.Grant{}, errors.New("backend did not answer")
}

// TestDeadlinePassesDuringHungRefresh: a lease whose keep-alive refresh is
// stuck in a store that ignores the refresh's context is lost at its
// deadline, not when the store gives up: a holder must learn it lost the
// lock before another can take it (seen: a deposed leader's Done closed
// 10s after its 1s term ended, the etcd store's batch timeout).
func TestDeadlinePassesDuringHungRefresh(t *testing.T) {
	t.Parallel()
	b := redisBackend(t)
	d := &deafRefresh{LeaseStore: b.store, entered: make(chan struct{}, 1), unblock: make(chan struct{})}
	defer close(d.unblock)
	c := newClient(t, d)
	l, err := c.Acquire(t.Context(), testenv.Name(t), 300*time.Millisecond, lock.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	<-d.entered
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done did not close while the refresh hung past the deadline")
	}
	if !errors.Is(l.Err(), lock.ErrExpired) {
		t.Fatalf("Err %v; want ErrExpired", l.Err())
	}
}

// TestKeptAliveLeasesHoldNoGoroutine: a kept-alive lease waits on a timer,
// not on a goroutine of its own, so that many held locks cost little
// memory (a goroutine per lease was about 6 KB of the 8 KB per held lock
// the scaling run measured).
func TestKeptAliveLeasesHoldNoGoroutine(t *testing.T) {
	c := newClient(t, redisBackend(t).store)
	const n = 200
	prefix := testenv.Name(t)
	leases := make([]*lock.Lease, 0, n)
	before := runtime.NumGoroutine()
	for i := range n {
		l, err := c.TryAcquire(t.Context(), fmt.Sprintf("%s-%d", prefix, i), 30*time.Second, lock.WithKeepAlive())
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if grew := runtime.NumGoroutine() - before; grew >= n/2 {
		t.Fatalf("%d goroutines more with %d kept-alive leases", grew, n)
	}
	for _, l := range leases {
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}
