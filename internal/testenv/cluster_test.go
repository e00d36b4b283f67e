package testenv_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// A proxied cluster's members reach each other through the proxies: with
// the leader's held, the others elect another leader. A restarted member
// keeps its proxy, and the cluster commits with one member's held, through
// the other members: the held one still hears the leader, so it takes
// requests it cannot get committed (etcd's "request timed out"; a client
// of all three sent it the write one time in a few).
func TestEtcdClusterProxied(t *testing.T) {
	t.Parallel()
	members, peers := testenv.EtcdClusterProxied(t, 3)
	var old int
	testenv.WaitUntil(t, 10*time.Second, func() bool {
		old = slices.IndexFunc(members, (*sequencer.Embedded).IsLeader)
		return old >= 0
	})
	peers[old].Hold(true)
	testenv.WaitUntil(t, 20*time.Second, func() bool {
		i := slices.IndexFunc(members, (*sequencer.Embedded).IsLeader)
		return i >= 0 && i != old
	})
	t.Logf("member %d's peer port held: member %d leads", old, slices.IndexFunc(members, (*sequencer.Embedded).IsLeader))
	peers[old].Hold(false)

	members[old].Close()
	again := testenv.Restart(t, members, old)
	if again.PeerURL() != "http://"+peers[old].Addr() {
		t.Fatalf("restarted member %d is reached at %s, want its proxy %s", old, again.PeerURL(), peers[old].Addr())
	}
	peers[old].Hold(true)
	cli := testenv.ClusterClient(t, slices.Delete(slices.Clone(members), old, old+1))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, testenv.Name(t), "x"); err != nil {
		t.Fatalf("a write with one member's peer port held: %v", err)
	}
	peers[old].Hold(false)
}
