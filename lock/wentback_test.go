package lock_test

import (
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// A running store whose etcd went back (replaced by a new, empty cluster
// with the documented step run on it, or restored from an older snapshot
// without it) notices, raises the floor, and serves: the first TryAcquire
// of a lock nobody holds is granted, with a token above every token issued
// before. With etcd leases the store answered the create whose token it
// had to give back ErrLost, which a TryAcquire (and so every acquire
// through the API without wait_ms) reported as held by another holder
// (docs/design.md, defect 231). With Redis leases the sequencer asks
// again itself.
func TestTryAcquireAfterEtcdWentBack(t *testing.T) {
	t.Parallel()
	for _, leases := range []string{"etcd", "redis"} {
		for _, how := range []string{"replaced", "restored"} {
			t.Run(leases+"/"+how, func(t *testing.T) {
				t.Parallel()
				tryAcquireAfterEtcdWentBack(t, leases, how)
			})
		}
	}
}

func tryAcquireAfterEtcdWentBack(t *testing.T, leases, how string) {
	e1, direct := testenv.Etcd(t)
	ctx := t.Context()
	p, cli := testenv.EtcdThroughProxy(t, e1)
	var s lock.LeaseStore
	if leases == "etcd" {
		s = newEtcdStore(t, cli)
	} else {
		seq, err := sequencer.NewEtcd(cli)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { seq.Close() })
		s = newRedisStore(t, testenv.Redis(t), seq)
	}
	c := newClient(t, s)
	const ttl = 2 * time.Second
	var max fence.Token
	grant := func(name string) {
		t.Helper()
		l, err := c.TryAcquire(ctx, name, ttl)
		if err != nil {
			t.Fatal(err)
		}
		max = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var snap string
	if how == "restored" {
		grant(testenv.Name(t))
		snap = testenv.SaveEtcdSnapshot(t, e1)
	} else {
		// Tokens on the old cluster above any the new one's floor gives
		// (a --min-token above the clock).
		if _, err := sequencer.RaiseFloor(ctx, direct, "", fence.Token(time.Now().UnixMicro())+1_000_000_000); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		grant(testenv.Name(t))
	}

	testenv.StopEtcdBehind(p, e1, direct)
	if how == "restored" {
		pointAtRestored(t, p, snap)
	} else {
		e2, cli2 := testenv.Etcd(t)
		// The documented step, on the new cluster: its floor is the clock,
		// below the tokens issued before.
		if _, err := sequencer.RaiseFloor(ctx, cli2, "", 0); err != nil {
			t.Fatal(err)
		}
		testenv.PointAt(p, e2)
	}
	name := testenv.Name(t) // never held
	l, err := c.TryAcquire(ctx, name, ttl)
	if err != nil {
		st, ierr := s.Inspect(ctx, name)
		t.Fatalf("first TryAcquire of %q after etcd was %s: %v (the lock: %+v, %v)", name, how, err, st, ierr)
	}
	defer l.Release(ctx)
	if l.Token() <= max {
		t.Fatalf("lock %q granted with token %d after etcd was %s, not above %d issued before", name, uint64(l.Token()), how, uint64(max))
	}
}

// pointAtRestored starts a new single member from snap, as etcdutl
// snapshot restore does, and points p at it; t.Cleanup closes it.
func pointAtRestored(t *testing.T, p *faultproxy.Proxy, snap string) {
	t.Helper()
	testenv.PointAt(p, testenv.RestoreEtcd(t, snap))
}
