package calls

import (
	"context"
	"testing"
	"time"
)

// BenchmarkBegin is what Begin and its end add to every acquisition, with
// callers on every CPU, each under a context with a deadline as an
// acquisition's usually is.
func BenchmarkBegin(b *testing.B) {
	var s Set
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, end, err := s.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			end()
		}
	})
}
