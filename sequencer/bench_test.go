package sequencer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fenced/fenced/sequencer"
)

// BenchmarkNext measures grants on a real embedded etcd with fsync on:
// sequential (one caller) and parallel on distinct names (group commit).
func BenchmarkNext(b *testing.B) {
	ctx := context.Background()
	e, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cli, err := e.Client()
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	// The floor of a lone grant: one etcd Put, as a client sends it.
	b.Run("etcd-put", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := cli.Put(ctx, "/bench/put", "x"); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, inflight := range []int{1, 4} {
		s, err := sequencer.NewEtcd(cli, sequencer.WithInflight(inflight))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprint("inflight-", inflight), func(b *testing.B) { benchNext(b, s) })
		s.Close()
	}
}

func benchNext(b *testing.B, s *sequencer.Etcd) {
	ctx := context.Background()
	b.Run("sequential", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := s.Next(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel-distinct-names", func(b *testing.B) {
		var id atomic.Int64
		before := s.Stats()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			name := fmt.Sprint("bench-", id.Add(1))
			for i := 0; pb.Next(); i++ {
				if _, err := s.Next(ctx, name); err != nil {
					b.Fatal(err)
				}
			}
		})
		after := s.Stats()
		b.ReportMetric(float64(after.Grants-before.Grants)/float64(after.Txns-before.Txns), "grants/txn")
	})
}
