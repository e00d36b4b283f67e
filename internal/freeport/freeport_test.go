package freeport

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// TestPortsAreDistinct: many ports asked for at once, as a test suite's
// clusters do, are all distinct and all bindable. Asking the kernel alone
// gives repeats: Linux picks ephemeral ports at random, so 2,000 draws from
// about 28,000 repeat dozens of times.
func TestPortsAreDistinct(t *testing.T) {
	const n = 2000
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[int]int{}
	)
	for range 4 {
		wg.Go(func() {
			for range n / 4 {
				p, err := Port()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seen[p]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for p, k := range seen {
		if k > 1 {
			t.Errorf("port %d handed out %d times", p, k)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct ports, want %d", len(seen), n)
	}
	u, err := URL()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", strings.TrimPrefix(u, "http://"))
	if err != nil {
		t.Fatalf("the port of %s cannot be bound: %v", u, err)
	}
	l.Close()
}
