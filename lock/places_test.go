package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// heldName is a name held by another holder of c's for 30 s, and a wait
// until its queue has n waiters.
func heldName(t *testing.T, c *lock.Client) (name string, holder *lock.Lease, waiters func(n int)) {
	t.Helper()
	name = testenv.Name(t)
	holder, err := c.TryAcquire(t.Context(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return name, holder, func(n int) {
		t.Helper()
		testenv.WaitUntil(t, 30*time.Second, func() bool {
			st, err := c.Inspect(t.Context(), name)
			return err == nil && st.Waiters == n
		})
	}
}

// TestWaiterKeepsItsPlaceAcrossCalls: an acquisition made of several
// calls with one WithWaiter id (a server serving a remote waiter's
// requests) waits in one place: A's first call ends without the lock, B
// queues, A calls again, and A gets the lock first. A place no call comes
// back to is given up after DefaultWaiterTTL, and on etcd leases at
// Close (on Redis leases it expires then); the etcd store keeps a place as
// long as its session otherwise, ahead of every later waiter.
func TestWaiterKeepsItsPlaceAcrossCalls(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t, b.store)
			ctx := t.Context()
			name, holder, waiters := heldName(t, c)
			const a = "0123456789abcdef0123456789abcdef"
			if _, err := c.Acquire(ctx, name, 5*time.Second, lock.WithWaiter(a), lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("A's first call: %v, want ErrNotAcquired", err)
			}
			waiters(1) // A's place, kept
			resB := acquireAsync(ctx, c, name, lock.WithWait(30*time.Second))
			waiters(2)
			resA := acquireAsync(ctx, c, name, lock.WithWaiter(a), lock.WithWait(30*time.Second))
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := testenv.Next(t, resA)
			if r.err != nil {
				t.Fatalf("A's second call: %v", r.err)
			}
			if st, err := c.Inspect(ctx, name); err != nil || st.Waiters != 1 {
				t.Fatalf("A holds the lock: %d waiters (%v), want B alone", st.Waiters, err)
			}
			r.l.Release(ctx)
			r = testenv.Next(t, resB)
			if r.err != nil {
				t.Fatalf("B: %v", r.err)
			}

			// A place nobody comes back to goes after the waiter TTL.
			const gone = "fedcba9876543210fedcba9876543210"
			if _, err := c.Acquire(ctx, name, 5*time.Second, lock.WithWaiter(gone), lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("a call while B holds: %v, want ErrNotAcquired", err)
			}
			waiters(1)
			waiters(0)
			// And one kept when the client closes goes with it.
			closing := newClient(t, b.store)
			if _, err := closing.Acquire(ctx, name, 5*time.Second, lock.WithWaiter(a), lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("a call while B holds: %v, want ErrNotAcquired", err)
			}
			if err := closing.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if b.name == "redis" {
				// Unless it expires first: on Redis leases the place is the
				// store's, which its waiter may use through another client
				// already (defect 193).
				waiters(0)
			} else if st, err := c.Inspect(ctx, name); err != nil || st.Waiters != 0 {
				t.Fatalf("after Close: %d waiters (%v), want the kept place given up", st.Waiters, err)
			}
			r.l.Release(ctx)
		})
	}
}

// A final call that ends while another call of the same waiter is still
// waiting (a request whose client gave up, not yet ended at the server,
// and the request the client sent to give its place up) marks the place:
// it goes when the last call ends. Before, the last call to end kept it
// for DefaultWaiterTTL, as any call that is not final does
// (docs/design.md, defect 134).
func TestFinalCallWhileAnotherWaits(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t, b.store)
			ctx := t.Context()
			name, holder, waiters := heldName(t, c)
			defer holder.Release(ctx)
			const w = "0123456789abcdef0123456789abcdef"
			cut, cancel := context.WithCancel(ctx)
			defer cancel()
			first := acquireAsync(cut, c, name, lock.WithWaiter(w), lock.WithWait(30*time.Second))
			waiters(1)
			if _, err := c.Acquire(ctx, name, 5*time.Second, lock.WithWaiter(w), lock.WithFinal(), lock.WithWait(50*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("the final call: %v, want ErrNotAcquired", err)
			}
			cancel()
			if r := testenv.Next(t, first); r.err == nil {
				t.Fatal("the call cut short got the lock")
			}
			if st, err := c.Inspect(ctx, name); err != nil || st.Waiters != 0 {
				t.Fatalf("after both calls ended: %d waiters (%v), want the place given up", st.Waiters, err)
			}
		})
	}
}

// TestLostGrantIsFoundAgain: a remote acquisition (WithWaiter) whose grant
// never reached its caller (the answer lost on the way, or the server that
// made it gone) asks again with the same waiter and gets the same lease:
// its lease id and token, its count unchanged, so one release frees it.
// Before, the second call waited behind its own lease until its TTL ran
// out. The record is bound to the grant: another waiter waits as usual,
// and after a release the waiter never gets a later holder's lease.
func TestLostGrantIsFoundAgain(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			ctx := t.Context()
			name := testenv.Name(t)
			const w = "00112233445566778899aabbccddeeff"
			remote := []lock.Option{lock.WithWaiter(w), lock.WithWait(time.Second), lock.WithDetached()}
			lost, err := c.Acquire(ctx, name, 30*time.Second, remote...)
			if err != nil {
				t.Fatal(err)
			}
			again, err := c.Acquire(ctx, name, 30*time.Second, remote...)
			if err != nil {
				t.Fatalf("the same waiter asking again: %v, want its lease", err)
			}
			if again.ID() != lost.ID() || again.Token() != lost.Token() {
				t.Fatalf("asked again: lease %s token %d; want the lost grant's %s token %d", again.ID(), again.Token(), lost.ID(), lost.Token())
			}
			if lost.Reused() || !again.Reused() {
				t.Fatalf("Reused: %v for the grant, %v for it found again; want false, true", lost.Reused(), again.Reused())
			}
			if _, err := c.Acquire(ctx, name, time.Second, lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("another waiter: %v, want ErrNotAcquired", err)
			}
			if _, err := c.Acquire(ctx, name, time.Second, lock.WithWaiter("ffeeddccbbaa99887766554433221100"), lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("another remote waiter: %v, want ErrNotAcquired", err)
			}
			if err := again.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Inspect(ctx, name); err != nil || st.Held {
				t.Fatalf("after one release: %+v, %v; want the lock free (the count was not raised)", st, err)
			}
			next, err := c.TryAcquire(ctx, name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Release(ctx)
			if l, err := c.Acquire(ctx, name, time.Second, lock.WithWaiter(w), lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("the waiter after its lease was released and the lock taken by another: %v (%v), want ErrNotAcquired", err, l)
			}
		})
	}
}

// TestLostOneAttemptGrantIsFoundAgain: WithWaiter on an acquisition with
// no place in the queue (TryAcquire, WithUnfair) names it, so that a
// request sent again after a lost answer gets the grant the first one
// made: its lease id and token, one release frees it. Before, the id was
// refused there, and a remote TryAcquire whose answer was lost left its
// lease holding the lock, known to nobody, until its TTL. It joins no
// queue, and a reentrant one (WithHolder) counts one hold, not two.
func TestLostOneAttemptGrantIsFoundAgain(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			ctx := t.Context()
			const w = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
			for _, k := range []struct {
				name string
				try  bool
				opts []lock.Option
			}{
				{"TryAcquire", true, nil},
				{"unfair", false, []lock.Option{lock.WithUnfair(), lock.WithWait(time.Second)}},
				{"reentrant TryAcquire", true, []lock.Option{lock.WithHolder("job-7")}},
			} {
				name := testenv.Name(t) + "-" + strings.ReplaceAll(k.name, " ", "-")
				get := func(opts ...lock.Option) (*lock.Lease, error) {
					opts = append(append(opts, k.opts...), lock.WithDetached())
					if k.try {
						return c.TryAcquire(ctx, name, 30*time.Second, opts...)
					}
					return c.Acquire(ctx, name, 30*time.Second, opts...)
				}
				lost, err := get(lock.WithWaiter(w))
				if err != nil {
					t.Fatalf("%s: %v", k.name, err)
				}
				again, err := get(lock.WithWaiter(w))
				if err != nil {
					t.Fatalf("%s: the same id asking again: %v, want its lease", k.name, err)
				}
				if again.ID() != lost.ID() || again.Token() != lost.Token() || !again.Reused() {
					t.Fatalf("%s: asked again: lease %s token %d (reused %v); want the lost grant's %s token %d", k.name, again.ID(), again.Token(), again.Reused(), lost.ID(), lost.Token())
				}
				if st, err := c.Inspect(ctx, name); err != nil || st.Waiters != 0 || st.Count != 1 {
					t.Fatalf("%s: %+v, %v; want no waiter and one hold", k.name, st, err)
				}
				if _, err := c.TryAcquire(ctx, name, time.Second, lock.WithWaiter("ffeeddccbbaa99887766554433221100")); !errors.Is(err, lock.ErrNotAcquired) {
					t.Fatalf("%s: another id: %v, want ErrNotAcquired", k.name, err)
				}
				if err := again.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if st, err := c.Inspect(ctx, name); err != nil || st.Held {
					t.Fatalf("%s: after one release: %+v, %v; want the lock free", k.name, st, err)
				}
			}
		})
	}
}

// A waiter whose call through one client (one fenced server) ended
// without the lock, and whose next call went through another (a drain, a
// rolling restart, a load balancer), lost its place: the first client
// gave its idle place up at Close, or when its own calls had left it idle
// for the waiter TTL, from under the call through the second, and the
// waiter that came after it got the lock first (docs/design.md, defect
// 193). With Redis leases (and Redlock's) places live in the store,
// shared by every client, and expire a waiter TTL after the last attempt
// that used them: a client no longer gives an idle one up. (With etcd
// leases a place is per server: a waiter that moves queues again.)
func TestWaiterMovedToAnotherClientKeepsItsPlace(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		if b.name == "etcd" {
			continue
		}
		for _, how := range []string{"close", "idle"} {
			t.Run(b.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				first, second := newClient(t, b.store), newClient(t, b.store)
				ctx := t.Context()
				name := testenv.Name(t)
				holder, err := second.TryAcquire(ctx, name, 30*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				waiters := func(n int) {
					t.Helper()
					testenv.WaitUntil(t, 30*time.Second, func() bool {
						st, err := second.Inspect(ctx, name)
						return err == nil && st.Waiters == n
					})
				}
				const w = "5e1f0c2d9b8a7f6e5d4c3b2a19080706"
				if _, err := first.Acquire(ctx, name, 5*time.Second, lock.WithWaiter(w), lock.WithWait(100*time.Millisecond)); !errors.Is(err, lock.ErrNotAcquired) {
					t.Fatalf("the waiter's call through the first client: %v, want ErrNotAcquired", err)
				}
				waiters(1) // its place, kept
				behind := acquireAsync(ctx, second, name, lock.WithWait(30*time.Second))
				waiters(2)
				moved := acquireAsync(ctx, second, name, lock.WithWaiter(w), lock.WithWait(30*time.Second))
				switch how {
				case "close":
					if err := first.Close(ctx); err != nil {
						t.Fatal(err)
					}
				case "idle":
					// Past the waiter TTL since the first client's call
					// ended: its timer, if it had one, has fired.
					<-time.After(lock.DefaultWaiterTTL + 500*time.Millisecond)
				}
				if err := holder.Release(ctx); err != nil {
					t.Fatal(err)
				}
				select {
				case r := <-moved:
					if r.err != nil {
						t.Fatalf("the waiter that moved: %v", r.err)
					}
					r.l.Release(ctx)
				case r := <-behind:
					if r.l != nil {
						r.l.Release(ctx)
					}
					t.Fatalf("the waiter that came second got the lock first (%v): the first lost its place when it moved to another client", r.err)
				}
				if r := testenv.Next(t, behind); r.err != nil {
					t.Fatalf("the second waiter: %v", r.err)
				} else {
					r.l.Release(ctx)
				}
			})
		}
	}
}

// A final call cut short by its caller's context did not end held by its
// wait: over HTTP that context is the request's, which ends when a proxy
// or the network cuts the connection, and the client, with no answer,
// asks again with the same waiter. Its place must wait for it (for
// DefaultWaiterTTL, as any call's that is not final), ahead of those who
// came after. Before, the place went with the cut call, and the next
// request queued behind a later candidate (docs/design.md, defect 241).
func TestCutFinalCallKeepsItsPlace(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t, b.store)
			ctx := t.Context()
			name, holder, waiters := heldName(t, c)
			const a = "0123456789abcdef0123456789abcdef"
			final := []lock.Option{lock.WithWaiter(a), lock.WithFinal(), lock.WithWait(30 * time.Second)}
			cut, cancel := context.WithCancel(ctx)
			first := acquireAsync(cut, c, name, final...)
			waiters(1)
			cancel()
			if r := testenv.Next(t, first); r.err == nil {
				t.Fatal("the call cut short got the lock")
			}
			if st, err := c.Inspect(ctx, name); err != nil || st.Waiters != 1 {
				t.Fatalf("after the final call was cut short: %d waiters (%v), want its place kept", st.Waiters, err)
			}
			later := acquireAsync(ctx, c, name, lock.WithWait(30*time.Second))
			waiters(2)
			again := acquireAsync(ctx, c, name, final...)
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := testenv.Next(t, again)
			if r.err != nil {
				t.Fatalf("the waiter's next call: %v (the later waiter was served first?)", r.err)
			}
			r.l.Release(ctx)
			if r := testenv.Next(t, later); r.err != nil {
				t.Fatalf("the later waiter: %v", r.err)
			} else {
				r.l.Release(ctx)
			}
		})
	}
}
