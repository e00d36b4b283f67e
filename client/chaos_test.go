package client_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/chaos"
	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
)

// TestChaos runs the randomized fault test of internal/chaos through the
// API: two fenced servers, each over a process of the lock package's setup
// (its own store and links to Redis or etcd), and two client processes,
// each a Client of both servers through proxies of its own, whose answers
// the nemesis loses, delays and cuts off as it does the servers' links.
func TestChaos(t *testing.T) {
	t.Parallel()
	for kind, setup := range map[string]func(*testing.T) chaos.Setup{"redis": chaos.Redis, "etcd": chaos.Etcd, "redlock": chaos.Redlock, "sentinel": chaos.Sentinel, "cluster": chaos.Cluster} {
		t.Run(kind, func(t *testing.T) {
			if kind != "etcd" {
				chaos.SkipUnlessLong(t) // the lock package's run covers the stores; here the API
			}
			t.Parallel()
			s := setup(t)
			var urls []string
			for i, l := range s.Lockers {
				srv := &restartable{}
				if err := srv.start(l.(*lock.Client)); err != nil {
					t.Fatal(err)
				}
				hs := httptest.NewServer(srv)
				t.Cleanup(hs.Close)
				urls = append(urls, hs.URL)
				s.Servers = append(s.Servers, func(down func()) error {
					// As a crash: requests are cut off, those in flight
					// with them, then the process stops.
					srv.up.Store(nil)
					hs.CloseClientConnections()
					c, err := s.Crash[i]()
					if err != nil {
						return err
					}
					down()
					return srv.start(c)
				})
			}
			if s.Lossy == nil {
				s.Lossy = map[*faultproxy.Proxy][]byte{}
			}
			s.Lockers = nil
			for range 2 { // client processes
				var links []*faultproxy.Proxy
				var through []string
				for _, u := range urls {
					p, pu := behindProxy(t, u)
					links = append(links, p)
					through = append(through, pu)
					s.Lossy[p] = []byte("/v1/") // locks and elections
				}
				s.Lockers = append(s.Lockers, newClient(t, strings.Join(through, ",")))
				s.Links = append(s.Links, links)
			}
			chaos.Run(t, s)
		})
	}
}

// restartable is a fenced server the nemesis restarts: while it is down
// it cuts off every request, as a dead process's port would.
type restartable struct{ up atomic.Pointer[server.Server] }

func (r *restartable) start(c *lock.Client) error {
	srv, err := server.New(server.Config{Locks: c, MaxTTL: time.Minute})
	if err != nil {
		return err
	}
	r.up.Store(srv)
	return nil
}

func (r *restartable) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	srv := r.up.Load()
	if srv == nil {
		panic(http.ErrAbortHandler) // the connection closes, unanswered
	}
	srv.ServeHTTP(w, req)
}
