package client_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/server"
)

// A client shared by many goroutines keeps their connections for the next
// requests: http.DefaultTransport keeps only 2 idle connections per host,
// so 32 goroutines opened about 30 new TCP connections for every round of
// requests, and paid a handshake each time.
func TestConcurrentRequestsReuseConnections(t *testing.T) {
	f := newFixture(t)
	srv, err := server.New(server.Config{Locks: f.locks, MaxTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var opened atomic.Int64
	hs := httptest.NewUnstartedServer(srv)
	hs.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			opened.Add(1)
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	c := newClient(t, hs.URL)
	base := testenv.Name(t)
	const goroutines = 32
	round := func(r int) int64 {
		before := opened.Load()
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l, err := c.TryAcquire(t.Context(), fmt.Sprintf("%s-%d-%d", base, r, i), 5*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Release(t.Context()); err != nil {
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		return opened.Load() - before
	}
	first := round(0)
	var later int64
	for r := 1; r <= 3; r++ {
		later += round(r)
	}
	t.Logf("connections opened: %d in the first round, %d in the three after it", first, later)
	if later > 8 {
		t.Errorf("%d connections opened in three rounds after the first (which opened %d): the client does not keep its connections", later, first)
	}
}
