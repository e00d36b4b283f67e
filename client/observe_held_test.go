package client_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/internal/locktest"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
)

// An observer by long polls of a fenced server whose etcd client reaches
// the three members of a healthy cluster, the link to one of them held
// (a member stopped by SIGSTOP, a link silently dropping), must show each
// new leader within 5 s while the link is still held. Each member's link
// is held in turn, so one of the rounds holds the member the server's
// watch stream is on. Before, each long poll waited for etcd to confirm
// its watch, which all the server's watches share one gRPC stream for:
// with that stream's member held the confirmation never came, and the
// poll answered 503 after its wait and the backend timeout, again and
// again, for as long as the hold; and a poll already waiting saw no
// event (docs/design.md, defect 194).
func TestObserveByLongPollWithOneMemberLinkHeld(t *testing.T) {
	t.Parallel()
	members := testenv.EtcdCluster(t, 3)
	viaProxies, links := testenv.ClusterClientProxied(t, members)
	url := etcdFixtureOn(t, viaProxies).serve(t, server.Config{})
	candidates := etcdFixtureOn(t, testenv.ClusterClient(t, members)).locks
	name := testenv.Name(t)
	ctx := t.Context()

	obs, err := newClient(t, url).Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	locktest.ObserveEachLinkHeld(t, candidates, obs, name, links, nil)
}

// TestLeaderLongPollWithOneMemberLinkHeld: a long poll (wait_ms 1000) of
// such a server is answered 200, with who leads, within its wait and a
// hedged read, whichever member's link is held. Before, the poll that
// began its watch on the held member's stream answered 503 after its
// wait and the backend timeout (docs/design.md, defect 194).
func TestLeaderLongPollWithOneMemberLinkHeld(t *testing.T) {
	t.Parallel()
	members := testenv.EtcdCluster(t, 3)
	viaProxies, links := testenv.ClusterClientProxied(t, members)
	url := etcdFixtureOn(t, viaProxies).serve(t, server.Config{})
	name := testenv.Name(t)
	poll := func() (api.Leader, int, time.Duration, error) {
		t0 := time.Now()
		resp, err := http.Get(url + "/v1/elections/" + name + "?after_token=0&wait_ms=1000")
		if err != nil {
			return api.Leader{}, 0, time.Since(t0), err
		}
		defer resp.Body.Close()
		var a api.Leader
		err = json.NewDecoder(resp.Body).Decode(&a)
		return a, resp.StatusCode, time.Since(t0), err
	}
	const within = 3 * time.Second // the wait, and a held read sent again (etcdkv.Stall)
	for i, link := range links {
		link.Hold(true)
		for k := range 2 {
			a, code, d, err := poll()
			if err != nil || code != http.StatusOK || d > within || a.Leader() != (lock.Leader{Name: name}) {
				t.Errorf("link to member %d held, poll %d: %d %+v (%v) in %s; want 200, nobody leading, within %s", i, k, code, a, err, d.Round(time.Millisecond), within)
			} else {
				t.Logf("link to member %d held, poll %d: answered in %s", i, k, d.Round(time.Millisecond))
			}
		}
		link.Hold(false)
	}
}
