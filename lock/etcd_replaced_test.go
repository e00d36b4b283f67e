package lock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// Defect 159 with etcd leases: the store of a fenced that ran while etcd
// was replaced by a new, empty cluster kept the old cluster's floor offset,
// the new floor key having the same mod revision (2), and granted tokens
// below those another store had granted for the same name on the new
// cluster.
func TestEtcdStoreOnAReplacedCluster(t *testing.T) {
	t.Parallel()
	e1, direct := testenv.Etcd(t)
	ctx := t.Context()
	name := testenv.Name(t)
	p, pcli := testenv.EtcdThroughProxy(t, e1)
	runningStore := newEtcdStore(t, pcli)
	running := newClient(t, runningStore)
	l, err := running.Acquire(ctx, name, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old := l.Token()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	direct.Close()
	p.Refuse(true)
	p.CutAll()
	e1.Close()
	p.Refuse(false)
	e2, cli2 := testenv.Etcd(t)
	// The documented step, on the new cluster.
	if _, err := sequencer.RaiseFloor(ctx, cli2, "", 0); err != nil {
		t.Fatal(err)
	}
	other := newClient(t, newEtcdStore(t, cli2))
	var max fence.Token
	for range 20 {
		l, err := other.Acquire(ctx, name, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		max = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.SetTarget(strings.TrimPrefix(e2.ClientURL(), "http://"))
	p.CutAll()
	l, err = running.Acquire(ctx, name, 2*time.Second, lock.WithWait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	t.Logf("running store: %d before the replacement; other store on the new cluster: up to %d; running store after: %d", uint64(old), uint64(max), uint64(l.Token()))
	if l.Token() <= max {
		t.Fatalf("lock %q granted with token %d, not above %d granted for it before this acquisition began", name, uint64(l.Token()), uint64(max))
	}
}
