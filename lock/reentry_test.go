package lock_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// A reentrant holder's release whose reply is lost is sent again by
// go-redis. It used to count down twice: one release of two freed the lock
// while the other hold still believed it held it (defect 19).
func TestLostReentrantReleaseReplyCountsOnce(t *testing.T) {
	pr := newProxiedRedis(t)
	c := newClient(t, pr.store)
	other := newClient(t, pr.store)
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.TryAcquire(t.Context(), name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil || again.Count() != 2 {
		t.Fatalf("reentry: %v", err)
	}
	lost := pr.proxy.LoseReply([]byte(scriptSHA(t, pr.direct, "scripts/prelude.lua", "scripts/release.lua")))
	if err := again.Release(t.Context()); err != nil {
		t.Fatalf("release of the reentry: %v", err)
	}
	<-lost
	if st, err := c.Inspect(t.Context(), name); err != nil || !st.Held || st.Count != 1 {
		t.Fatalf("after one release of two, its reply lost: %+v, %v; want held, count 1", st, err)
	}
	if l, err := other.TryAcquire(t.Context(), name, 30*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another client's acquire while the first hold (token %d) is valid: %v, %v", a.Token(), l, err)
	}
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A reentrant acquire whose reply is lost is sent again by go-redis. It
// used to count up twice: after as many releases as acquisitions the lock
// stayed held, by nobody, for its TTL (defect 19).
func TestLostReentrantAcquireReplyCountsOnce(t *testing.T) {
	t.Parallel()
	pr := newProxiedRedis(t)
	c := newClient(t, pr.store)
	name := testenv.Name(t)
	a, err := c.Acquire(t.Context(), name, 30*time.Second, lock.WithHolder("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	lost := pr.proxy.LoseReply([]byte(scriptSHA(t, pr.direct, "scripts/prelude.lua", "scripts/acquire.lua")))
	again, err := c.TryAcquire(t.Context(), name, 30*time.Second, lock.WithHolder("worker-1"))
	<-lost
	if err != nil {
		t.Fatalf("reentry after a lost reply: %v", err)
	}
	if again.Count() != 2 {
		t.Errorf("reentry counted %d holds, want 2", again.Count())
	}
	if err := errors.Join(again.Release(t.Context()), a.Release(t.Context())); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(t.Context(), name); err != nil || st.Held {
		t.Fatalf("after as many releases as acquisitions: %+v, %v; want free", st, err)
	}
}

// A reentry with a shorter TTL, or a shorter refresh of one of several
// holds, used to shorten the lock under the holds before it, whose
// validity did not change: another client could take the lock while they
// still held it (defect 1, through reentry; defect 19).
func TestShorterReentryKeepsTheLongerHold(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			a, err := c.Acquire(t.Context(), name, 20*time.Second, lock.WithHolder("h"))
			if err != nil {
				t.Fatal(err)
			}
			again, err := c.TryAcquire(t.Context(), name, b.ttl, lock.WithHolder("h"))
			if err != nil {
				t.Fatal(err)
			}
			remaining := func(what string) {
				t.Helper()
				st, err := c.Inspect(t.Context(), name)
				if err != nil || !st.Held || st.Remaining < 15*time.Second {
					t.Fatalf("after %s: %+v, %v; want held for the first hold's 20s", what, st, err)
				}
			}
			remaining("a reentry with a TTL of " + b.ttl.String())
			if err := again.Refresh(t.Context(), b.ttl); err != nil {
				t.Fatal(err)
			}
			remaining("a refresh of the reentry to " + b.ttl.String())
			if err := errors.Join(again.Release(t.Context()), a.Release(t.Context())); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A fair reentry that queued behind another holder, then found the lock
// held by its own holder, kept its place in the Redis queue: the place
// stood ahead of every later fair waiter on the free lock until it
// expired, about 3 s (defect 11 on Redis leases; defect 19).
func TestQueuedReentryLeavesItsPlace(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			x, err := c.Acquire(t.Context(), name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			waiters := func() int {
				st, err := c.Inspect(t.Context(), name)
				if err != nil {
					t.Fatal(err)
				}
				return st.Waiters
			}
			type res struct {
				l   *lock.Lease
				err error
			}
			got := make(chan res, 2)
			for want := 1; want <= 2; want++ {
				go func() {
					l, err := c.Acquire(t.Context(), name, 30*time.Second, lock.WithHolder("h"), lock.WithWait(20*time.Second))
					got <- res{l, err}
				}()
				testenv.WaitUntil(t, 30*time.Second, func() bool { return waiters() == want })
			}
			if err := x.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			r1, r2 := <-got, <-got
			if r1.err != nil || r2.err != nil {
				t.Fatalf("holder h: %v, %v", r1.err, r2.err)
			}
			if n := waiters(); n != 0 {
				t.Fatalf("held twice by h, %d place(s) left in the queue; want none", n)
			}
			if err := errors.Join(r2.l.Release(t.Context()), r1.l.Release(t.Context())); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// After a force-release, the removed holder's release used to succeed on
// Redis leases, even with another holder on the lock: the record kept for
// Inspect read as its own release. It has lost its lease, and must hear so.
func TestReleaseAfterForceReleaseIsLost(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			a, err := c.Acquire(t.Context(), name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.ForceRelease(t.Context(), name); err != nil {
				t.Fatal(err)
			}
			st, err := c.Inspect(t.Context(), name)
			if err != nil || st.Held || (b.name == "redis" && st.LastToken != a.Token()) {
				t.Fatalf("after the force-release: %+v, %v; want free (on Redis, last token %d)", st, err, a.Token())
			}
			next, err := c.TryAcquire(t.Context(), name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Release(t.Context())
			if err := b.store.Release(t.Context(), name, a.ID(), ""); !errors.Is(err, lock.ErrLost) {
				t.Errorf("the removed holder's release, token %d holding: %v; want ErrLost", next.Token(), err)
			}
		})
	}
}

// A release sent again with its id (a retry after a lost answer, or a
// second Lease.Release after a failed one) takes off one hold of a
// reentrant lock, not two, on each store; another id takes off the next
// (defect 29).
func TestReleaseSentAgainTakesOffOneHold(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			a, err := c.Acquire(t.Context(), name, 30*time.Second, lock.WithHolder("worker-1"), lock.WithDetached())
			if err != nil {
				t.Fatal(err)
			}
			if again, err := c.TryAcquire(t.Context(), name, 30*time.Second, lock.WithHolder("worker-1"), lock.WithDetached()); err != nil || again.Count() != 2 {
				t.Fatalf("reentry: %v", err)
			}
			op := strings.Repeat("5a", 16)
			for range 3 {
				if err := b.store.Release(t.Context(), name, a.ID(), op); err != nil {
					t.Fatal(err)
				}
				if st, err := c.Inspect(t.Context(), name); err != nil || !st.Held || st.Count != 1 {
					t.Fatalf("after one release sent again: %+v, %v; want held once", st, err)
				}
			}
			if err := b.store.Release(t.Context(), name, a.ID(), strings.Repeat("6b", 16)); err != nil {
				t.Fatal(err)
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || st.Held {
				t.Fatalf("after the second release: %+v, %v; want free", st, err)
			}
		})
	}
}

// TestReentrySentAgainCountsOnce: a waiting reentry whose answer is lost
// is sent again by the HTTP client with the same waiter, and the server
// makes it a new attempt, with a new lease id. The stores marked a reentry
// by its attempt's lease id, so the resend counted a second hold: the lock
// stayed held after as many releases as acquisitions, until its TTL. The
// waiter now marks it: the same acquisition again finds its hold counted,
// another acquisition counts its own.
func TestReentrySentAgainCountsOnce(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newClient(t, b.store)
			name := testenv.Name(t)
			opts := []lock.Option{lock.WithHolder("worker-1"), lock.WithDetached()}
			first, err := c.Acquire(t.Context(), name, 30*time.Second, opts...)
			if err != nil {
				t.Fatal(err)
			}
			waiter := strings.Repeat("7c", 16)
			for i := range 3 { // the request, then sent again twice
				l, err := c.Acquire(t.Context(), name, 30*time.Second, append(opts, lock.WithWaiter(waiter))...)
				if err != nil {
					t.Fatal(err)
				}
				if l.Count() != 2 || l.ID() != first.ID() {
					t.Fatalf("reentry sent %d times: count %d, lease %s; want 2 and the first's %s", i+1, l.Count(), l.ID(), first.ID())
				}
			}
			other, err := c.Acquire(t.Context(), name, 30*time.Second, append(opts, lock.WithWaiter(strings.Repeat("8d", 16)))...)
			if err != nil || other.Count() != 3 {
				t.Fatalf("another acquisition: %v, count %d; want 3", err, other.Count())
			}
			for i := range 3 {
				if err := b.store.Release(t.Context(), name, first.ID(), strings.Repeat(fmt.Sprintf("%x", 10+i), 32)); err != nil {
					t.Fatal(err)
				}
			}
			if st, err := c.Inspect(t.Context(), name); err != nil || st.Held {
				t.Fatalf("after three releases of three acquisitions: %+v, %v; want free", st, err)
			}
		})
	}
}

// TestUnreenterUnhanded: the take-off a server runs for a reentry whose
// client went away (defect 183). It takes off the hold that the
// acquisition counted, once; not one that another request of the
// acquisition (another attempt, with the same id) was handed, nor the
// holder's own; and on Redis not one the same attempt counted and then
// found again (go-redis sends a script again after a lost reply).
func TestUnreenterUnhanded(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			u, ok := b.store.(lock.UnhandedUnreenterer)
			if !ok {
				t.Fatalf("%T is not a lock.UnhandedUnreenterer", b.store)
			}
			ctx := t.Context()
			name := testenv.Name(t)
			const holder = "worker-3"
			first, err := b.store.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: strings.Repeat("1a", 16), TTL: 30 * time.Second, Holder: holder})
			if err != nil {
				t.Fatal(err)
			}
			count := func() int {
				t.Helper()
				st, err := b.store.Inspect(ctx, name)
				if err != nil || !st.Held {
					t.Fatalf("inspect: %+v, %v; want held", st, err)
				}
				return st.Count
			}
			reenter := func(attempt, waiter string) {
				t.Helper()
				g, err := b.store.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: attempt, TTL: 30 * time.Second, Holder: holder, Rejoin: waiter})
				if err != nil || g.LeaseID != first.LeaseID {
					t.Fatalf("reentry: %+v, %v; want the holder's lease %s", g, err, first.LeaseID)
				}
			}
			w1, w2, w3 := strings.Repeat("b1", 16), strings.Repeat("b2", 16), strings.Repeat("b3", 16)

			reenter(strings.Repeat("2a", 16), w1)
			if b.name == "redis" {
				reenter(strings.Repeat("2a", 16), w1) // the same attempt's script, run again
			}
			if n := count(); n != 2 {
				t.Fatalf("after one reentry: count %d, want 2", n)
			}
			if ok, err := u.UnreenterUnhanded(ctx, name, strings.Repeat("9f", 16), w1); ok || err != nil {
				t.Fatalf("take-off under another lease id: %v, %v; want false", ok, err)
			}
			if ok, err := u.UnreenterUnhanded(ctx, name, first.LeaseID, w1); !ok || err != nil {
				t.Fatalf("take-off of a hold handed to nobody: %v, %v; want true", ok, err)
			}
			if ok, err := u.UnreenterUnhanded(ctx, name, first.LeaseID, w1); ok || err != nil {
				t.Fatalf("the take-off again: %v, %v; want false", ok, err)
			}
			if n := count(); n != 1 {
				t.Fatalf("after the take-off: count %d, want 1", n)
			}
			if ok, err := u.UnreenterUnhanded(ctx, name, first.LeaseID, w3); ok || err != nil {
				t.Fatalf("take-off of a reentry never made: %v, %v; want false", ok, err)
			}

			// The acquisition asks again: its hold counts anew, and a copy of
			// that request (another attempt) is handed it.
			reenter(strings.Repeat("3a", 16), w1)
			reenter(strings.Repeat("4a", 16), w1)
			reenter(strings.Repeat("5a", 16), w2)
			if n := count(); n != 3 {
				t.Fatalf("after two acquisitions' reentries: count %d, want 3", n)
			}
			if ok, err := u.UnreenterUnhanded(ctx, name, first.LeaseID, w1); ok || err != nil {
				t.Fatalf("take-off of a hold a copy was handed: %v, %v; want false", ok, err)
			}
			if ok, err := u.UnreenterUnhanded(ctx, name, first.LeaseID, w2); !ok || err != nil {
				t.Fatalf("take-off of the other acquisition's hold: %v, %v; want true", ok, err)
			}
			if n := count(); n != 2 {
				t.Fatalf("after taking off one of three: count %d, want 2", n)
			}
			for i := range 2 {
				if err := b.store.Release(ctx, name, first.LeaseID, strings.Repeat(fmt.Sprintf("%x", 10+i), 32)); err != nil {
					t.Fatal(err)
				}
			}
			if st, err := b.store.Inspect(ctx, name); err != nil || st.Held {
				t.Fatalf("after two releases of the two holds: %+v, %v; want free", st, err)
			}
		})
	}
}

// TestFailedReentryLeavesAHoldACopyWasHanded: a reentry through one fenced
// server whose answer did not come in time (its client gone, Redis slow)
// is sent again by its client through another server, which is handed
// the hold the first one counted; the first server's store then takes
// off, as for any failed reentry, what its attempt may have counted. It
// must not take off the hold the copy was handed: the holder would be one
// release short, and its outer hold's lock free under it. Before, that
// take-off ignored the hand-over, and a second holder took the lock while
// the first believed it held it (3 of 3 through two servers, one with
// Redis 300 ms away: docs/design.md, defect 214).
func TestFailedReentryLeavesAHoldACopyWasHanded(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			name := testenv.Name(t)
			const holder = "worker-4"
			first, err := b.store.Acquire(ctx, lock.AcquireRequest{Name: name, LeaseID: strings.Repeat("1a", 16), TTL: 30 * time.Second, Holder: holder})
			if err != nil {
				t.Fatal(err)
			}
			waiter := strings.Repeat("c1", 16)
			slow := lock.AcquireRequest{Name: name, LeaseID: strings.Repeat("2a", 16), TTL: 30 * time.Second, Holder: holder, Rejoin: waiter}
			copied := slow
			copied.LeaseID = strings.Repeat("3a", 16)
			for _, req := range []lock.AcquireRequest{slow, copied} { // counted, then handed
				if g, err := b.store.Acquire(ctx, req); err != nil || g.LeaseID != first.LeaseID || g.Count != 2 {
					t.Fatalf("reentry: %+v, %v; want the holder's lease %s, count 2", g, err, first.LeaseID)
				}
			}
			lock.UnreenterFailed(ctx, b.store, slow, first.LeaseID)
			if st, err := b.store.Inspect(ctx, name); err != nil || st.Count != 2 {
				t.Fatalf("after the slow attempt's take-off: %+v, %v; want count 2, the hold the copy was handed kept", st, err)
			}
			for i := range 2 {
				if err := b.store.Release(ctx, name, first.LeaseID, strings.Repeat(fmt.Sprintf("%x", 10+i), 32)); err != nil {
					t.Fatal(err)
				}
			}
			if st, err := b.store.Inspect(ctx, name); err != nil || st.Held {
				t.Fatalf("after two releases of the two holds: %+v, %v; want free", st, err)
			}
		})
	}
}
