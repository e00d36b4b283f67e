package lock_test

import (
	"testing"

	"github.com/fenced/fenced/internal/chaos"
	"github.com/fenced/fenced/lock"
)

// TestChaos runs the randomized fault test of internal/chaos on each lease
// store: two processes, each with its own store, lock client and links,
// over a three-member etcd cluster (and, for Redis leases, a Redis of the
// test's own; for Redlock, three; with Sentinel, a master, its replica and
// a Sentinel; on a Redis Cluster, three masters).
func TestChaos(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		setup func(*testing.T) chaos.Setup
		long  bool // FENCED_CHAOS runs only
	}{
		{"redis", chaos.Redis, false},
		{"etcd", chaos.Etcd, false},
		{"redlock", chaos.Redlock, true},
		{"sentinel", chaos.Sentinel, true},
		{"cluster", chaos.Cluster, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.long {
				chaos.SkipUnlessLong(t)
			}
			t.Parallel()
			chaos.Run(t, c.setup(t))
		})
	}
}

// The randomized fault test reports an abandoned attempt's mark left in
// etcd on a lease longer than the mark's life (docs/design.md, defect
// 206): it must know that life.
func TestChaosAbandonedFor(t *testing.T) {
	if chaos.AbandonedFor != lock.AbandonedFor {
		t.Fatalf("chaos.AbandonedFor is %s; an abandoned mark lasts %s (lock/etcd.go, abandonedFor)", chaos.AbandonedFor, lock.AbandonedFor)
	}
}
