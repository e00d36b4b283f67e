package pgfence

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenced/fenced/bench/internal/benchkit"
)

// BenchmarkUpdate runs each mode from parallel clients (16 with the default
// parallelism of 8 per GOMAXPROCS on two CPUs; set with -cpu) and reports
// tx/s; the unguarded sub-benchmark is the baseline:
//
//	cd bench && go test -run '^$' -bench Update -benchtime 5s ./pgfence
func BenchmarkUpdate(b *testing.B) {
	ctx := context.Background()
	const parallelism = 8
	clients := parallelism * runtime.GOMAXPROCS(0)
	pool, err := connect(ctx, benchkit.PostgresDefault(), clients, "")
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	w, err := setup(ctx, pool, 1024)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := w.drop(ctx); err != nil {
			b.Error(err)
		}
	}()
	for _, m := range allModes {
		b.Run(m.name, func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				cl := newClient(w, int(next.Add(1)-1)%clients, clients)
				for pb.Next() {
					if err := cl.do(ctx, m); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
		})
	}
}

// TestModes runs each mode once, so that go test ./... checks the
// benchmark's code.
func TestModes(t *testing.T) {
	ctx := t.Context()
	pool, err := connect(ctx, benchkit.PostgresDefault(), 2, "")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w, err := setup(ctx, pool, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.drop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	cl := newClient(w, 0, 1)
	for _, m := range allModes {
		for range 3 {
			if err := cl.do(ctx, m); err != nil {
				t.Fatalf("%s: %v", m.name, err)
			}
		}
	}
	var sum int64
	if err := pool.QueryRow(ctx, "SELECT sum(balance) FROM "+pgx.Identifier{w.schema, "accounts"}.Sanitize()).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if want := int64(3 * len(allModes)); sum != want {
		t.Fatalf("sum of balances %d, want %d", sum, want)
	}
}
