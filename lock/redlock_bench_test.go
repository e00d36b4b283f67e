package lock_test

import (
	"testing"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/redis/go-redis/v9"
)

// BenchmarkRedlockAcquireRelease: pairs on a Redlock of three Redis
// servers of the benchmark's own, sequential and parallel.
func BenchmarkRedlockAcquireRelease(b *testing.B) {
	nodes := make([]redis.UniversalClient, 3)
	for i := range nodes {
		c := testenv.StartRedis(b).Client()
		if err := c.Ping(b.Context()).Err(); err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
	}
	s, err := lock.NewRedlockStore(nodes, newSequencer(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	benchPairs(b, newClient(b, s))
}
