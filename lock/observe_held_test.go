package lock_test

import (
	"testing"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// An observer whose etcd client reaches the three members of a healthy
// cluster, the link to one of them held (nothing delivered, nothing
// reset: a member stopped by SIGSTOP, a link silently dropping), must
// show each new leader within 5 s while the link is still held: the other
// two members answer. Each member's link is held in turn, so one of the
// rounds holds the member the observer's watch stream is on. Before, the
// observer re-read who leads only after a watch event, and all the
// watches of one etcd client share one gRPC stream: while that stream's
// member was held no event came, and the observer showed the old leader
// (or nobody) for as long as the hold (docs/design.md, defect 194).
func TestObserveWithOneMemberLinkHeld(t *testing.T) { observeWithOneMemberHeld(t, false) }

// TestObserveWithOneMemberFrozen: the same, the held member also cut off
// from its peers, as a SIGSTOP of its process or a paused VM would.
func TestObserveWithOneMemberFrozen(t *testing.T) { observeWithOneMemberHeld(t, true) }

func observeWithOneMemberHeld(t *testing.T, freeze bool) {
	t.Parallel()
	var (
		members []*sequencer.Embedded
		peers   []*faultproxy.Proxy
	)
	if freeze {
		members, peers = testenv.EtcdClusterProxied(t, 3)
	} else {
		members = testenv.EtcdCluster(t, 3)
	}
	viaProxies, links := testenv.ClusterClientProxied(t, members)
	candidates := newClient(t, newEtcdStore(t, testenv.ClusterClient(t, members)))
	observer := newClient(t, newEtcdStore(t, viaProxies))
	name := testenv.Name(t)
	ctx := t.Context()

	obs, err := observer.Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	var during func(int) func()
	if freeze {
		during = func(i int) func() { return testenv.Isolate(members, peers, i) }
	}
	locktest.ObserveEachLinkHeld(t, candidates, obs, name, links, during)
}
