package lock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
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

// BenchmarkHotLockQueue measures the handoffs of one lock that n fair
// waiters queue for, each holding it 5 ms when its turn comes and then
// queueing again: ns/op is one handoff, attempts/op the store's acquire
// attempts per handoff (Redis: a script each; etcd: a create Txn, a Raft
// write, or for a waiter behind the head a read-only Txn), most of them
// made by waiters behind the head to keep their places (docs/design.md,
// "Waiting"); with etcd, txns/op and reads/op say which. Run with a fixed
// count, for example
// -benchtime=300x: each run queues its n waiters first.
func BenchmarkHotLockQueue(b *testing.B) {
	for _, mk := range []func(testing.TB) backend{redisBackend, etcdBackend} {
		be := mk(b)
		for _, n := range []int{8, 64, 256} {
			b.Run(fmt.Sprintf("%s/waiters=%d", be.name, n), func(b *testing.B) { benchQueue(b, be.store, n) })
		}
	}
}

func benchQueue(b *testing.B, store lock.LeaseStore, n int) {
	counted := &attemptCounter{LeaseStore: store, ws: map[string]*waiterSeen{}}
	c := newClient(b, counted)
	name := fmt.Sprintf("bench-queue-%d-%d", n, b.N)
	first, err := newClient(b, store).TryAcquire(context.Background(), name, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		handoffs atomic.Int64
		wg       sync.WaitGroup
		errs     = make(chan error, n)
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := c.Acquire(ctx, name, 10*time.Second)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
				time.Sleep(5 * time.Millisecond) // the holder's work
				if handoffs.Add(1) >= int64(b.N) {
					cancel()
				}
				if err := l.Release(context.Background()); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	testenv.WaitUntil(b, 30*time.Second, func() bool { st, err := c.Inspect(ctx, name); return err == nil && st.Waiters == n })
	attempts := func() (sum int) {
		for _, w := range counted.attempts() {
			sum += w.n
		}
		return sum
	}
	etcdStats := func() lock.EtcdStats {
		if es, ok := store.(*lock.EtcdStore); ok {
			return es.Stats()
		}
		return lock.EtcdStats{}
	}
	a0, e0 := attempts(), etcdStats()
	b.ResetTimer()
	if err := first.Release(context.Background()); err != nil {
		b.Fatal(err)
	}
	<-ctx.Done()
	b.StopTimer()
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	h := float64(handoffs.Load())
	b.ReportMetric(float64(attempts()-a0)/h, "attempts/op")
	if e := etcdStats(); e.Txns > 0 {
		b.ReportMetric(float64(e.Txns-e0.Txns)/h, "txns/op")
		b.ReportMetric(float64(e.Reads-e0.Reads)/h, "reads/op")
	}
}
