package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// Defect 102: the refreshes of a lease are numbered, and a store applies
// none below the highest it applied: one that arrives late cannot shorten
// the lease a later one extended. Sent again with its number, a refresh
// applies again; one without a number is unordered, as before.
func TestRefreshesApplyInOrder(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			c := newClient(t, b.store)
			name := testenv.Name(t)
			a, err := c.Acquire(ctx, name, 10*time.Second, lock.WithDetached())
			if err != nil {
				t.Fatal(err)
			}
			const short = 500 * time.Millisecond
			early, later := lock.NextRefreshSeq(), lock.NextRefreshSeq()
			if _, err := b.store.Refresh(ctx, name, a.ID(), 10*time.Second, later); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Refresh(ctx, name, a.ID(), short, early); !errors.Is(err, lock.ErrOutOfOrder) {
				t.Fatalf("a refresh numbered below one applied before it: %v; want ErrOutOfOrder", err)
			}
			// Not applied: the lease keeps the later refresh's TTL.
			if st, err := c.Inspect(ctx, name); err != nil || !st.Held || st.Remaining <= short {
				t.Fatalf("after the refused refresh to %s: %+v, %v; want held for longer", short, st, err)
			}
			if _, err := b.store.Refresh(ctx, name, a.ID(), 10*time.Second, later); err != nil {
				t.Fatalf("the later refresh sent again: %v", err)
			}
			if _, err := b.store.Refresh(ctx, name, a.ID(), 10*time.Second, 0); err != nil {
				t.Fatalf("an unnumbered refresh: %v", err)
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Defect 102 as it happens: a refresh to a shorter TTL is held in the
// network until its caller gave up, a later refresh extends the lease,
// and then the held one reaches Redis. Before, Redis applied it last and
// freed the lock at the shorter TTL while the holder, counting from the
// later refresh, believed it held it: another client took it.
func TestLateShorterRefreshIsNotApplied(t *testing.T) {
	t.Parallel()
	pr, direct := newSlowRetryProxiedRedis(t)
	c, other := newClient(t, direct), newClient(t, direct)
	ctx := t.Context()
	name := testenv.Name(t)
	a, err := c.Acquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	const short = 200 * time.Millisecond
	// The shorter refresh goes by the proxy, which holds it: its caller
	// gives up, the bytes wait on their way. (On a connection open before,
	// or the held bytes would be the connection's handshake.)
	if err := pr.rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	pr.proxy.Hold(true)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pr.store.Refresh(rctx, name, a.ID(), short, lock.NextRefreshSeq())
	cancel()
	if err == nil {
		t.Fatal("a refresh held in the network answered")
	}
	if err := a.Refresh(ctx, 10*time.Second); err != nil {
		t.Fatalf("the later refresh: %v", err)
	}
	pr.proxy.Hold(false) // the held refresh reaches Redis now, within a few ms
	// Applied, it would leave the lock at most the shorter TTL: watch the
	// lock for a second, and then take it while its holder holds it.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		st, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Remaining <= short {
			l, err := other.Acquire(ctx, name, time.Second, lock.WithWait(5*time.Second))
			if err != nil {
				t.Fatalf("the lock has %s left while its holder believes it holds it until %s (%v)", st.Remaining, a.Deadline().Format(time.StampMilli), err)
			}
			l.Release(ctx)
			t.Fatalf("two holders: token %d granted while the holder of token %d believes it holds the lock until %s", l.Token(), a.Token(), a.Deadline().Format(time.StampMilli))
		}
		time.Sleep(20 * time.Millisecond) // polling the lock's state, not synchronising
	}
	if err := a.Err(); err != nil {
		t.Fatalf("the holder after the later refresh: %v", err)
	}
}

// While a lock is held more than once no refresh shortens it, so none is
// refused for its number; once one hold is left, it orders its refreshes
// by its own numbers, whatever the others' were (another process's clock).
func TestLastHoldOrdersItsOwnRefreshes(t *testing.T) {
	t.Parallel()
	for _, b := range everyStore(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			c := newClient(t, b.store)
			name := testenv.Name(t)
			first, err := c.Acquire(ctx, name, 10*time.Second, lock.WithHolder("worker-5e1f"), lock.WithDetached())
			if err != nil {
				t.Fatal(err)
			}
			second, err := c.Acquire(ctx, name, 10*time.Second, lock.WithHolder("worker-5e1f"), lock.WithDetached())
			if err != nil {
				t.Fatal(err)
			}
			mine, ahead := lock.NextRefreshSeq(), lock.NextRefreshSeq()+3600e6 // a clock an hour ahead
			if _, err := b.store.Refresh(ctx, name, second.ID(), 10*time.Second, ahead); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Refresh(ctx, name, first.ID(), 10*time.Second, mine); err != nil {
				t.Fatalf("a refresh numbered lower while the lock is held twice: %v; want applied", err)
			}
			if err := second.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Refresh(ctx, name, first.ID(), 10*time.Second, mine+1); err != nil {
				t.Fatalf("the last hold's refresh after the other's numbers: %v; want applied", err)
			}
			if _, err := b.store.Refresh(ctx, name, first.ID(), 10*time.Second, mine); !errors.Is(err, lock.ErrOutOfOrder) {
				t.Fatalf("the last hold's own earlier number: %v; want ErrOutOfOrder", err)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
