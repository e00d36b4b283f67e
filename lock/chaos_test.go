package lock_test

import (
	"testing"

	"github.com/fenced/fenced/internal/chaos"
)

// TestChaos runs the randomized fault test of internal/chaos on each lease
// store: two processes, each with its own store, lock client and links,
// over a three-member etcd cluster (and, for Redis leases, a Redis of the
// test's own; for Redlock, three; with Sentinel, a master, its replica and
// a Sentinel; on a Redis Cluster, three masters).
func TestChaos(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		chaos.Run(t, chaos.Redis(t))
	})
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		chaos.Run(t, chaos.Etcd(t))
	})
	t.Run("redlock", func(t *testing.T) {
		chaos.SkipUnlessLong(t)
		t.Parallel()
		chaos.Run(t, chaos.Redlock(t))
	})
	t.Run("sentinel", func(t *testing.T) {
		chaos.SkipUnlessLong(t)
		t.Parallel()
		chaos.Run(t, chaos.Sentinel(t))
	})
	t.Run("cluster", func(t *testing.T) {
		chaos.SkipUnlessLong(t)
		t.Parallel()
		chaos.Run(t, chaos.Cluster(t))
	})
}
