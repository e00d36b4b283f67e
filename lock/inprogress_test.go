package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// Defect 158: a remote acquisition's request, sent again through another
// server while the first was still taking its token, found the lease
// under another lease id and answered that another holder had the lock;
// the client's TryAcquire over [slow A, B] said "held" for a lock that
// was its own, then free. It is told the earlier request is in progress,
// and asked again once that one confirmed, it is handed the grant.
func TestRejoinWhileTheFirstRequestTakesItsToken(t *testing.T) {
	t.Parallel()
	seq := newSequencer(t)
	frozen, thaw := make(chan struct{}), make(chan struct{})
	slow := &freezingSequencer{Sequencer: seq, freeze: func() { close(frozen); <-thaw }}
	prefix := testenv.Name(t) + ":"
	a, err := lock.NewRedisStore(testenv.Redis(t), slow, lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := lock.NewRedisStore(testenv.Redis(t), seq, lock.WithRedisPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	warmUp(t, a)
	ctx := t.Context()
	name, waiter := testenv.Name(t), newID(t)
	req := lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: 30 * time.Second, Rejoin: waiter}

	slow.armed.Store(true)
	type result struct {
		g   lock.Grant
		err error
	}
	first := make(chan result, 1)
	go func() {
		g, err := a.Acquire(ctx, req)
		first <- result{g, err}
	}()
	<-frozen // a took the lease and its token, not yet confirmed
	again := req
	again.LeaseID = newID(t)
	if g, err := b.Acquire(ctx, again); !errors.Is(err, lock.ErrInProgress) {
		close(thaw)
		t.Fatalf("the acquisition's next request while the first takes its token: %+v, %v; want ErrInProgress", g, err)
	}
	close(thaw)
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	again.LeaseID = newID(t)
	g, err := b.Acquire(ctx, again)
	if err != nil || g.LeaseID != r.g.LeaseID || g.Token != r.g.Token {
		t.Fatalf("asked again once the first confirmed: %+v, %v; want handed %+v", g, err, r.g)
	}
	if err := b.Release(ctx, name, g.LeaseID, ""); err != nil {
		t.Fatal(err)
	}
}
