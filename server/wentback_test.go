package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// TestAcquireAfterEtcdReplaced: with leases in etcd, a fenced running
// while its etcd is replaced by a new cluster (the documented step run on
// it, its floor below the tokens issued before) grants the first acquire
// of a lock nobody holds, above every token before. It answered 409 held
// by another holder: the store gave back the create whose token was too
// low as lost, and an acquire without wait_ms makes one attempt
// (docs/design.md, defect 231).
func TestAcquireAfterEtcdReplaced(t *testing.T) {
	t.Parallel()
	e1, direct := testenv.Etcd(t)
	ctx := t.Context()
	p, cli := testenv.EtcdThroughProxy(t, e1)
	store, err := lock.NewEtcdStore(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := newEnv(t, store, nil)
	// Tokens on the old cluster above the clock, as after a --min-token.
	if _, err := sequencer.RaiseFloor(ctx, direct, "", fence.Token(time.Now().UnixMicro())+1_000_000_000); err != nil {
		t.Fatal(err)
	}
	var max uint64
	for range 3 {
		l := e.mustAcquire(testenv.Name(t), `{"ttl_ms":5000}`)
		max = uint64(l.Token)
	}

	testenv.StopEtcdBehind(p, e1, direct)
	e2, cli2 := testenv.Etcd(t)
	if _, err := sequencer.RaiseFloor(ctx, cli2, "", 0); err != nil {
		t.Fatal(err)
	}
	testenv.PointAt(p, e2)
	name := testenv.Name(t)
	l, r := e.acquire(name, `{"ttl_ms":5000}`)
	if r.status != http.StatusOK {
		t.Fatalf("first acquire of %s, never held, after etcd was replaced: %d %s", name, r.status, r.body)
	}
	if uint64(l.Token) <= max {
		t.Fatalf("token %d after etcd was replaced, not above %d issued before", uint64(l.Token), max)
	}
}
