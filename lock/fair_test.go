package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// Fair waiting, reentrancy, owners, List and ForceRelease, on each store.

// TestFairWaitingInArrivalOrder: waiters that arrive one after another get
// the lock in that order, not in whatever order they happen to retry.
func TestFairWaitingInArrivalOrder(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			inArrivalOrder(t, c, []*lock.Client{c, c, c, c, c}, nil)
		})
	}
}

// TestFairWaitingAcrossStores: waiters each in a process of their own (an
// etcd store each, as fenced servers are) get the lock in arrival order
// too. A store that knows nothing of a lock asks first only whether it is
// free; finding it taken, it must join the queue before its caller waits,
// or a later waiter would go first.
func TestFairWaitingAcrossStores(t *testing.T) {
	_, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	clients := make([]*lock.Client, 6)
	for i := range clients {
		s, err := lock.NewEtcdStore(cli, lock.WithEtcdPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		clients[i] = newClient(t, s)
	}
	inArrivalOrder(t, clients[0], clients[1:], nil)
}

// inArrivalOrder has holder take a lock, and waiters[i] arrive one after
// another, each once the one before has its place; queued, if not nil,
// runs then, before the release; the lock must go to them in that order.
func inArrivalOrder(t *testing.T, holder *lock.Client, waiters []*lock.Client, queued func()) {
	name := testenv.Name(t)
	held, err := holder.Acquire(t.Context(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	n := len(waiters)
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
		errs  = make(chan error, n)
	)
	for i, c := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(context.Background(), name, 30*time.Second, lock.WithWait(30*time.Second))
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			errs <- l.Release(context.Background())
		}()
		// The next waiter arrives once this one has its place.
		testenv.WaitUntil(t, 30*time.Second, func() bool { st, err := holder.Inspect(t.Context(), name); return err == nil && st.Waiters == i+1 })
	}
	st, err := holder.Inspect(t.Context(), name)
	if err != nil || st.Waiters != n || st.OldestWait <= 0 {
		t.Fatalf("inspect with %d waiting: %+v, %v", n, st, err)
	}
	if queued != nil {
		queued()
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range order {
		if w != i {
			t.Fatalf("the lock went to the waiters in the order %v, want arrival order", order)
		}
	}
}

// TestWaitersBehindTheHeadOnlyKeepTheirPlace: with the lock held, a fair
// waiter behind the head of the queue attempts only to keep its place,
// every third of the place's life, not at the retry strategy's pace: with
// hundreds of waiters on one lock those attempts were most of the store's
// load, on etcd each a Raft write (docs/design.md, "Waiting"). The head
// keeps the strategy's pace, and the lock still goes in arrival order.
func TestWaitersBehindTheHeadOnlyKeepTheirPlace(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			counted := &attemptCounter{LeaseStore: b.store, ws: map[string]*waiterSeen{}}
			c := newClient(t, counted)
			inArrivalOrder(t, newClient(t, b.store), []*lock.Client{c, c, c, c}, func() {
				// Once past their first rounds (subscribing may take a few),
				// count the attempts each made while the head, at the
				// strategy's cap (256 ms), made eight: about two seconds.
				testenv.WaitUntil(t, 30*time.Second, func() bool { return counted.attempts()[0].n >= 8 })
				from, began := counted.attempts(), time.Now()
				testenv.WaitUntil(t, 30*time.Second, func() bool { return counted.attempts()[0].n >= from[0].n+8 })
				to, took := counted.attempts(), time.Since(began)
				for i, w := range to {
					if w.pos != i+1 {
						t.Fatalf("waiter %d of %d said place %d: %v", i+1, len(to), w.pos, to)
					}
					// One attempt a second to keep its place (fewer on a
					// slow machine), and one the window may cut in two.
					if n, most := w.n-from[i].n, 2+int(took.Seconds()); i > 0 && n > most {
						t.Fatalf("waiter %d, behind the head, attempted %d times in %s while the head did 8: more than once a second (%v, %v)", i+1, n, took.Round(time.Millisecond), from, to)
					}
				}
				t.Logf("in %s: attempts so far %v, then %v", took.Round(time.Millisecond), from, to)
			})
		})
	}
}

// TestNewHeadIsToldItIsNext: a waiter behind the head attempts only every
// third of its place's life, so it must be told when it becomes the head
// while the lock is held: the head before it took the lock, or left. Then
// an expiry that nobody publishes (a holder that died) finds it awake, at
// the strategy's pace. On Redis nothing told it (etcd's waiters watch the
// place ahead), and the lock, free, waited for its next attempt: about
// 700 ms after the expiry here (docs/design.md, defect 250).
func TestNewHeadIsToldItIsNext(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		for _, how := range []string{"the head takes the lock", "the head leaves"} {
			t.Run(b.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				s, name, ctx := b.store, testenv.Name(t), t.Context()
				holder, head := newID(t), newID(t)
				if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: holder, TTL: 30 * time.Second}); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: time.Second, Waiter: head, WaiterTTL: 10 * time.Second}); !errors.Is(err, lock.ErrNotAcquired) {
					t.Fatalf("the head joins: %v", err)
				}
				counted := &attemptCounter{LeaseStore: s, ws: map[string]*waiterSeen{}}
				got := make(chan time.Time, 1)
				go func() {
					l, err := newClient(t, counted).Acquire(context.Background(), name, 5*time.Second, lock.WithWait(30*time.Second))
					got <- time.Now()
					if err != nil {
						t.Errorf("the waiter behind: %v", err)
						return
					}
					_ = l.Release(context.Background())
				}()
				// Settled behind the head, at the pace of a waiter there;
				// what follows comes just after one of its attempts.
				testenv.WaitUntil(t, 30*time.Second, func() bool { ws := counted.attempts(); return len(ws) == 1 && ws[0].n >= 3 && ws[0].pos == 2 })
				n := counted.attempts()[0].n
				testenv.WaitUntil(t, 10*time.Second, func() bool { return counted.attempts()[0].n > n })
				ttl := max(b.ttl, 300*time.Millisecond) // the lease that will expire, its holder gone
				began := time.Now()
				if how == "the head takes the lock" {
					if err := s.Release(ctx, name, holder, ""); err != nil {
						t.Fatal(err)
					}
					if _, err := s.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: ttl, Waiter: head, WaiterTTL: 10 * time.Second}); err != nil {
						t.Fatalf("the head takes the lock: %v", err)
					}
				} else {
					if err := s.Leave(ctx, name, head); err != nil {
						t.Fatal(err)
					}
					if _, err := s.Refresh(ctx, name, holder, ttl, 0); err != nil {
						t.Fatal(err)
					}
				}
				expired := began.Add(ttl)
				select {
				case at := <-got:
					// Woken, it attempts at the strategy's pace (256 ms at
					// most), capped at the holder's remaining TTL.
					late := at.Sub(expired)
					t.Logf("the waiter got the lock %s after the expiry", late.Round(time.Millisecond))
					if late < 0 {
						t.Fatalf("the waiter got the lock %s before its holder's lease expired", -late.Round(time.Millisecond))
					}
					if late > 400*time.Millisecond {
						t.Fatalf("the lock, free since its holder's lease expired, went to the waiter now at the head %s later", late.Round(time.Millisecond))
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the waiter never got the lock")
				}
			})
		}
	}
}

// attemptCounter counts each fair waiter's attempts, and keeps the place
// its last held answer gave.
type attemptCounter struct {
	lock.LeaseStore
	mu    sync.Mutex
	order []string // the waiters, in the order of their first attempt
	ws    map[string]*waiterSeen
}

type waiterSeen struct{ n, pos int }

func (c *attemptCounter) Acquire(ctx context.Context, req lock.AcquireRequest) (lock.Grant, error) {
	g, err := c.LeaseStore.Acquire(ctx, req)
	if req.Waiter != "" {
		c.mu.Lock()
		w := c.ws[req.Waiter]
		if w == nil {
			w = &waiterSeen{}
			c.ws[req.Waiter] = w
			c.order = append(c.order, req.Waiter)
		}
		w.n++
		if held := (*lock.HeldError)(nil); errors.As(err, &held) {
			w.pos = held.Position
		}
		c.mu.Unlock()
	}
	return g, err
}

// attempts is what was seen of each waiter so far (attempts, place), in
// the order of their first attempt.
func (c *attemptCounter) attempts() []waiterSeen {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws []waiterSeen
	for _, id := range c.order {
		ws = append(ws, *c.ws[id])
	}
	return ws
}

// TestWaiterThatGivesUpLeaves: a waiter that gives up leaves the queue at
// once; one that dies leaves it when its place expires. Neither blocks
// those behind it for long.
func TestWaiterThatGivesUpLeaves(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			holder, err := c.Acquire(t.Context(), name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Acquire(t.Context(), name, time.Second, lock.WithWait(300*time.Millisecond))
			var we *lock.WaitError
			if !errors.As(err, &we) || !errors.Is(err, lock.ErrNotAcquired) || we.Waited < 300*time.Millisecond {
				t.Fatalf("a waiter whose budget ran out: %v, want a WaitError saying how long it waited", err)
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || st.Waiters != 0 {
				t.Fatalf("after the waiter gave up: %+v, %v; want nobody waiting", st, err)
			}
			// A waiter that died: its place stays until it expires.
			dead := "00000000000000000000000000000dead"
			_, err = b.store.Acquire(t.Context(), lock.AcquireRequest{Name: name, LeaseID: "0123456789abcdef0123456789abcdef",
				TTL: time.Second, Waiter: dead, WaiterTTL: 500 * time.Millisecond})
			if !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("the dead waiter's attempt: %v", err)
			}
			next := make(chan error, 1)
			go func() {
				l, err := c.Acquire(context.Background(), name, time.Second, lock.WithWait(30*time.Second))
				if err == nil {
					err = l.Release(context.Background())
				}
				next <- err
			}()
			testenv.WaitUntil(t, 30*time.Second, func() bool { st, _ := c.Inspect(t.Context(), name); return st.Waiters == 2 })
			if err := holder.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if b.name == "etcd" {
				// A dead waiter's place rides on its store's session: here the
				// store lives, so the place must be given up for it.
				if err := b.store.Leave(t.Context(), name, dead); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-next; err != nil {
				t.Fatalf("the waiter behind a dead one: %v", err)
			}
		})
	}
}

// TestReentrant: the same holder acquiring a lock it holds gets the same
// lease and token and a count; each release counts down; another holder
// waits.
func TestReentrant(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			a, err := c.Acquire(t.Context(), name, 5*time.Second, lock.WithHolder("worker-1"), lock.WithOwner("host-a"))
			if err != nil {
				t.Fatal(err)
			}
			again, err := c.TryAcquire(t.Context(), name, 5*time.Second, lock.WithHolder("worker-1"))
			if err != nil {
				t.Fatalf("the holder acquiring again: %v", err)
			}
			if again.ID() != a.ID() || again.Token() != a.Token() {
				t.Fatalf("reentry: lease %s token %d, want %s %d", again.ID(), again.Token(), a.ID(), a.Token())
			}
			if a.Reused() || !again.Reused() {
				t.Fatalf("Reused: %v for the first hold, %v for the reentry; want false, true", a.Reused(), again.Reused())
			}
			st, err := c.Inspect(t.Context(), name)
			if err != nil || st.Count != 2 || st.Holder != "worker-1" || st.Owner != "host-a" {
				t.Fatalf("inspect after reentry: %+v, %v", st, err)
			}
			if _, err := c.TryAcquire(t.Context(), name, time.Second, lock.WithHolder("worker-2")); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("another holder: %v, want ErrNotAcquired", err)
			}
			if _, err := c.TryAcquire(t.Context(), name, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("no holder: %v, want ErrNotAcquired", err)
			}
			if err := again.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || !st.Held || st.Count != 1 {
				t.Fatalf("after one release of two: %+v, %v; want held, count 1", st, err)
			}
			if err := a.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || st.Held || st.LastToken != a.Token() {
				t.Fatalf("after the last release: %+v, %v; want free, last token %d", st, err, a.Token())
			}
			// A fair reentry (Acquire, not TryAcquire) left no place in
			// the queue behind it: a fair waiter gets the free lock.
			a, err = c.Acquire(t.Context(), name, 5*time.Second, lock.WithHolder("worker-1"))
			if err != nil {
				t.Fatal(err)
			}
			again, err = c.Acquire(t.Context(), name, 5*time.Second, lock.WithHolder("worker-1"), lock.WithWait(2*time.Second))
			if err != nil || again.Count() != 2 {
				t.Fatalf("a fair reentry: %v", err)
			}
			if err := errors.Join(again.Release(t.Context()), a.Release(t.Context())); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				l, err := c.Acquire(t.Context(), name, 5*time.Second, lock.WithWait(2*time.Second))
				if err != nil {
					t.Fatalf("a fair waiter after the reentrant holder released (%d): %v", i, err)
				}
				if err := l.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestListAndForceRelease: owners and waiters show in List, pages cover
// every held lock once, and a force-release frees a lock whose holder then finds it
// lost.
func TestListAndForceRelease(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			prefix := testenv.Name(t) + ":"
			held := map[string]*lock.Lease{}
			for i := 0; i < 5; i++ {
				name := fmt.Sprint(prefix, "job-", i)
				l, err := c.Acquire(t.Context(), name, 30*time.Second, lock.WithOwner(fmt.Sprint("runner-", i)), lock.WithDetached())
				if err != nil {
					t.Fatal(err)
				}
				held[name] = l
			}
			other, err := c.Acquire(t.Context(), testenv.Name(t), 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Release(t.Context())
			// Two wait for job-1: List counts them, as Inspect does.
			waiting, stopWaiting := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer stopWaiting()
			for range 2 {
				wg.Go(func() { c.Acquire(waiting, prefix+"job-1", time.Second) })
			}
			testenv.WaitUntil(t, 30*time.Second, func() bool { st, _ := c.Inspect(t.Context(), prefix+"job-1"); return st.Waiters == 2 })
			seen := map[string]bool{}
			cursor := ""
			for pages := 0; ; pages++ {
				page, err := c.List(t.Context(), prefix, 2, cursor)
				if err != nil {
					t.Fatal(err)
				}
				if len(page.Locks) > 2 || pages > 10 {
					t.Fatalf("page %d: %d locks, next %q", pages, len(page.Locks), page.Next)
				}
				for _, st := range page.Locks {
					l := held[st.Name]
					if l == nil || seen[st.Name] || st.LeaseID != l.ID() || st.Token != l.Token() || st.Owner == "" || st.Remaining <= 0 {
						t.Fatalf("listed %+v", st)
					}
					if want := map[bool]int{true: 2}[st.Name == prefix+"job-1"]; st.Waiters != want || (want > 0) != (st.OldestWait > 0) {
						t.Fatalf("listed %s with %d waiters, the oldest waiting %s; want %d", st.Name, st.Waiters, st.OldestWait, want)
					}
					seen[st.Name] = true
				}
				if cursor = page.Next; cursor == "" {
					break
				}
			}
			if len(seen) != len(held) {
				t.Fatalf("listed %d of %d held locks", len(seen), len(held))
			}
			if _, err := c.List(t.Context(), prefix, 2, "not a cursor"); !errors.Is(err, lock.ErrInvalidCursor) {
				t.Fatalf("a made-up cursor: %v", err)
			}
			victim := prefix + "job-3"
			st, err := c.ForceRelease(t.Context(), victim)
			if err != nil || !st.Held || st.LeaseID != held[victim].ID() {
				t.Fatalf("force-release: %+v, %v", st, err)
			}
			if st, err := c.Inspect(t.Context(), victim); err != nil || st.Held {
				t.Fatalf("after force-release: %+v, %v", st, err)
			}
			if _, err := c.RefreshID(t.Context(), victim, held[victim].ID(), time.Second, 0); !errors.Is(err, lock.ErrLost) {
				t.Fatalf("the holder's refresh after a force-release: %v, want ErrLost", err)
			}
			if st, err := c.ForceRelease(t.Context(), victim); err != nil || st.Held {
				t.Fatalf("force-release of a free lock: %+v, %v", st, err)
			}
		})
	}
}

// A lock held while List's pages are read is listed, whatever is released
// meanwhile. The Redis store's cursor used to skip a page's keys by their
// position in the SCAN call they came in, so a release of a lock listed
// already shifted an unlisted one into the part skipped.
func TestListFindsLocksHeldThroughout(t *testing.T) {
	t.Parallel()
	_, redlock := startRedlock(t)
	stores := []backend{
		{name: "redis", store: newRedisStore(t, testenv.StartRedis(t).Client(), newSequencer(t))},
		{name: "redlock", store: redlock},
		etcdBackend(t),
	}
	for _, b := range stores {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			prefix := testenv.Name(t) + ":"
			held := map[string]*lock.Lease{}
			for i := range 10 {
				name := fmt.Sprintf("%sjob-%02d", prefix, i)
				l, err := c.Acquire(t.Context(), name, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				held[name] = l
			}
			seen := map[string]bool{}
			cursor := ""
			for pages := 0; ; pages++ {
				page, err := c.List(t.Context(), prefix, 3, cursor)
				if err != nil || len(page.Locks) > 3 || pages > 10 {
					t.Fatalf("page %d: %d locks, next %q, %v", pages, len(page.Locks), page.Next, err)
				}
				for _, st := range page.Locks {
					seen[st.Name] = true
				}
				// Release a lock this page listed: the next pages must
				// still list every lock held throughout.
				if len(page.Locks) > 0 && held[page.Locks[0].Name] != nil {
					if err := held[page.Locks[0].Name].Release(t.Context()); err != nil {
						t.Fatal(err)
					}
					delete(held, page.Locks[0].Name)
				}
				if cursor = page.Next; cursor == "" {
					break
				}
			}
			for name := range held {
				if !seen[name] {
					t.Errorf("%s, held throughout, was never listed", name)
				}
			}
		})
	}
}

// TestWaitErrorSaysThePlace: a waiter whose budget runs out learns how long
// it waited and its place in the queue then, on each store.
func TestWaitErrorSaysThePlace(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			holder, err := c.Acquire(t.Context(), name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Release(t.Context())
			first := make(chan error, 1)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go func() {
				_, err := c.Acquire(ctx, name, time.Second)
				first <- err
			}()
			testenv.WaitUntil(t, 30*time.Second, func() bool { st, _ := c.Inspect(t.Context(), name); return st.Waiters == 1 })
			_, err = c.Acquire(t.Context(), name, time.Second, lock.WithWait(200*time.Millisecond))
			var we *lock.WaitError
			if !errors.As(err, &we) || we.Position != 2 || we.Waited < 200*time.Millisecond {
				t.Fatalf("the second waiter's error: %v (%+v), want a WaitError at place 2", err, we)
			}
			cancel()
			<-first
		})
	}
}

// A release names the first waiter still waiting, not a place whose waiter
// went away without leaving (its place expired, and stays in the queue
// until a script drops it). release.lua dropped expired places before it
// named the queue's head; force.lua and leave.lua named the head as it
// was: a dead place, or, when a leaving waiter stood behind one, nobody.
// The live waiter behind it was not woken, and waited for its backoff.
func TestWakeSkipsExpiredPlaces(t *testing.T) {
	t.Parallel()
	const (
		ghost  = "00000000000000000000000000000dead" // its place expired
		live   = "0000000000000000000000000000a11e"
		leaver = "000000000000000000000000000001ea"
	)
	cases := []struct {
		name  string
		queue []string // in arrival order
		leave string   // the waiter that leaves the queue of a free lock; "" to force-release a held one
	}{
		{"force-release", []string{ghost, live}, ""},
		{"leave at the head", []string{leaver, ghost, live}, leaver},
		{"leave behind an expired place", []string{ghost, leaver, live}, leaver},
	}
	type store struct {
		name   string
		s      lock.LeaseStore
		nodes  []*redis.Client
		prefix string
	}
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t) + ":"
	rs, err := lock.NewRedisStore(rdb, newSequencer(t), lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	procs, rl := startRedlock(t)
	var rlNodes []*redis.Client
	for _, p := range procs {
		rlNodes = append(rlNodes, p.Client())
	}
	for _, st := range []store{{"redis", rs, []*redis.Client{rdb}, prefix}, {"redlock", rl, rlNodes, "fenced:"}} {
		for _, tc := range cases {
			t.Run(st.name+"/"+tc.name, func(t *testing.T) {
				name := testenv.Name(t)
				if tc.leave == "" {
					if _, err := newClient(t, st.s).TryAcquire(t.Context(), name, 30*time.Second); err != nil {
						t.Fatal(err)
					}
				}
				// The queue as a waiter that died leaves it: its place
				// expired, not yet dropped.
				k := st.prefix + "{" + name + "}:"
				alive := float64(time.Now().Add(time.Minute).UnixMilli())
				for _, rdb := range st.nodes {
					_, err := rdb.TxPipelined(t.Context(), func(p redis.Pipeliner) error {
						for i, w := range tc.queue {
							expires := alive
							if w == ghost {
								expires = 1
							}
							p.ZAdd(t.Context(), k+"queue", redis.Z{Score: float64(i + 1), Member: w})
							p.ZAdd(t.Context(), k+"places", redis.Z{Score: expires, Member: w})
						}
						p.PExpire(t.Context(), k+"queue", time.Minute)
						p.PExpire(t.Context(), k+"places", time.Minute)
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				woken := map[string]<-chan struct{}{}
				for _, w := range []string{ghost, live} {
					ch, stop, err := st.s.Watch(t.Context(), name, w)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(stop)
					woken[w] = ch
				}
				if tc.leave == "" {
					if before, err := st.s.ForceRelease(t.Context(), name, 0); err != nil || !before.Held {
						t.Fatalf("force-release: %+v, %v", before, err)
					}
				} else if err := st.s.Leave(t.Context(), name, tc.leave); err != nil {
					t.Fatal(err)
				}
				select {
				case <-woken[live]:
				case <-woken[ghost]:
					t.Fatal("the expired place was named: the live waiter behind it was not woken")
				case <-time.After(30 * time.Second):
					t.Fatal("nobody was woken in 30s")
				}
			})
		}
	}
}
