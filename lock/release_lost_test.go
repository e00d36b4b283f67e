package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// Lease.Release promises ErrLost when the lease had been lost before: a
// write made under it may have overlapped another holder's. After a
// release that got no answer it counted every "lost" before the deadline
// as released, on the reasoning that nothing but that release took the
// lease away. A Redis restart without persistence (or a failover) does
// too: here the lease goes with a restart, another holder takes the lock
// and holds it, the first holder's release meets a blip, and its second
// Release said nil. Redis knows its "not held" is certain while its list
// of released lease ids has room, and the second Release now says
// ErrLost (docs/design.md, defect 173).
func TestReleaseAfterARestartLostTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r := testenv.StartRedis(t)
	px, err := faultproxy.New(r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	rdbA := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdbA.Close() })
	rdbB := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdbB.Close() })
	seq := newSequencer(t)
	a, b := newClient(t, newRedisStore(t, rdbA, seq)), newClient(t, newRedisStore(t, rdbB, seq))
	name := testenv.Name(t)

	la, err := a.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Redis restarts empty: the lease is gone, and another process takes
	// the lock.
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	var lb *lock.Lease
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		lb, err = b.TryAcquire(ctx, name, 30*time.Second)
		return err == nil
	})
	defer lb.Release(ctx)
	// The first holder releases; a blip eats its release.
	px.Refuse(true)
	px.CutAll()
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = la.Release(rctx)
	cancel()
	if err == nil || errors.Is(err, lock.ErrLost) {
		t.Fatalf("release through a refusing link: %v; want an error that is not ErrLost", err)
	}
	px.Refuse(false)
	if err := la.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("second Release: %v; want ErrLost: the lease went with a Redis restart, and token %d held the lock meanwhile", err, lb.Token())
	}
}

// A release whose reply was lost was applied: the second Release, which
// finds its own record, is nil, as before (defect 4). With 16 handovers
// or more between the two (each a next holder's acquire and release),
// Redis's list of released ids may have dropped it: the store says ErrLost
// but cannot tell it from its own release's answer (ErrMaybeReleased),
// and Lease.Release still counts it as released.
func TestReleaseSentAgainAfterALostReplyIsReleased(t *testing.T) {
	t.Parallel()
	pr := newProxiedRedis(t)
	other, err := lock.NewRedisStore(pr.direct, pr.seq, lock.WithRedisPrefix(pr.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	c, next := newClient(t, pr.store), newClient(t, other)
	ctx := t.Context()
	sha := scriptSHA(t, pr.direct, "scripts/prelude.lua", "scripts/release.lua")
	for _, handovers := range []int{0, 3, 17} {
		t.Run(fmt.Sprint(handovers, " handovers"), func(t *testing.T) {
			name := testenv.Name(t)
			l, err := c.Acquire(ctx, name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			// Applied, its reply lost, and the link refused until the
			// call gives up.
			fired := pr.proxy.LoseReplyAndRefuse([]byte(sha))
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = l.Release(rctx)
			cancel()
			select {
			case <-fired:
			default:
				t.Fatalf("the release's reply was not lost (Release: %v)", err)
			}
			pr.proxy.Refuse(false)
			if err == nil || errors.Is(err, lock.ErrLost) {
				t.Fatalf("release with its reply lost: %v; want an error that is not ErrLost", err)
			}
			for range handovers {
				m, err := next.TryAcquire(ctx, name, 30*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("second Release after %d handovers: %v; want nil: its first released the lease", handovers, err)
			}
			// What the store itself says: released while it remembers it,
			// else "lost" (which Lease.Release forgave).
			err = pr.store.Release(ctx, name, l.ID(), "")
			if handovers < 16 && err != nil || handovers >= 16 && !errors.Is(err, lock.ErrLost) {
				t.Fatalf("the store's answer to the release sent again after %d handovers: %v", handovers, err)
			}
		})
	}
}
