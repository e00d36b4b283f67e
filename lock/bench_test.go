package lock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/lock"
)

// BenchmarkAcquireRelease measures one acquire and release through
// lock.Client on each store, alone and with parallel clients on distinct
// names. bench/ compares the stores with their peers; this is for
// profiling the library's own path (-cpuprofile, -benchmem).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, mk := range []func(testing.TB) backend{redisBackend, etcdBackend} {
		be := mk(b)
		b.Run(be.name, func(b *testing.B) { benchPairs(b, newClient(b, be.store)) })
	}
}

func benchPairs(b *testing.B, c *lock.Client) {
	ctx := context.Background()
	b.Run("sequential", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l, err := c.Acquire(ctx, "bench-seq", 5*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var id atomic.Int64
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			name := fmt.Sprint("bench-par-", id.Add(1))
			for pb.Next() {
				l, err := c.Acquire(ctx, name, 5*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
