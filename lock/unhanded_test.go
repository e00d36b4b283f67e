package lock_test

import (
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// Defect 153: a grant made for a remote acquisition whose client went away
// is released unless another request of the acquisition, through another
// store (another server), was handed it meanwhile; then it is that
// request's, and stays.
func TestReleaseUnhandedLeavesAHandedGrant(t *testing.T) {
	t.Parallel()
	_, cli := testenv.Etcd(t)
	seq, err := sequencer.NewEtcd(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	redisPrefix, etcdPrefix := testenv.Name(t)+":", "/"+testenv.Name(t)+"/"
	two := func(t *testing.T, kind string) (a, b lock.LeaseStore) {
		stores := make([]lock.LeaseStore, 2)
		for i := range stores {
			var s lock.LeaseStore
			var err error
			if kind == "redis" {
				s, err = lock.NewRedisStore(testenv.Redis(t), seq, lock.WithRedisPrefix(redisPrefix))
			} else {
				s, err = lock.NewEtcdStore(testenv.EtcdClient(t, cli.Endpoints()...), lock.WithEtcdPrefix(etcdPrefix))
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.(interface{ Close() error }).Close() })
			stores[i] = s
		}
		return stores[0], stores[1]
	}
	for _, kind := range []string{"redis", "etcd"} {
		t.Run(kind, func(t *testing.T) {
			a, b := two(t, kind)
			ctx := t.Context()
			for _, handed := range []bool{true, false} {
				name, waiter := testenv.Name(t), newID(t)
				req := lock.AcquireRequest{Name: name, LeaseID: newID(t), TTL: 30 * time.Second, Rejoin: waiter}
				g, err := a.Acquire(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if handed {
					again := req
					again.LeaseID = newID(t)
					h, err := b.Acquire(ctx, again)
					if err != nil || h.LeaseID != g.LeaseID {
						t.Fatalf("the acquisition's next request through the other store: %+v, %v; want handed lease %s", h, err, g.LeaseID)
					}
				}
				released, err := a.(lock.UnhandedReleaser).ReleaseUnhanded(ctx, name, g.LeaseID)
				if err != nil || released == handed {
					t.Fatalf("handed %v: ReleaseUnhanded: %v, %v", handed, released, err)
				}
				st, err := b.Inspect(ctx, name)
				if err != nil || st.Held != handed || handed && st.LeaseID != g.LeaseID {
					t.Fatalf("handed %v: after ReleaseUnhanded: %+v, %v", handed, st, err)
				}
			}
		})
	}
}
