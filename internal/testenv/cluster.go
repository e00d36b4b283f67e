package testenv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdCluster starts n embedded etcd members of one cluster, concurrently
// (each waits for a quorum), with etcd's timing halved (50ms ticks, 500ms
// elections) so that failovers in tests are quick. They are closed by
// t.Cleanup.
func EtcdCluster(t testing.TB, n int) []*sequencer.Embedded {
	t.Helper()
	return EtcdClusterTimed(t, n, 50, 500)
}

// EtcdClusterTimed is EtcdCluster with the given Raft tick and election
// timeout in milliseconds (etcd's defaults are 100 and 1000).
func EtcdClusterTimed(t testing.TB, n int, tickMs, electionMs uint) []*sequencer.Embedded {
	t.Helper()
	return etcdCluster(t, n, tickMs, electionMs, nil)
}

// EtcdClusterProxied is EtcdCluster with each member reached by the
// others through a proxy the test controls (peers[i] is member i's): the
// members advertise the proxies and listen apart. Held, a member's proxy
// stops what the others' connections to it carry: its messages on their
// streams, and their pipelined ones to it; its own connections to them
// still bring it their streamed messages (etcd's rafthttp). The proxies
// are closed by t.Cleanup.
func EtcdClusterProxied(t testing.TB, n int) (members []*sequencer.Embedded, peers []*faultproxy.Proxy) {
	t.Helper()
	for range n {
		p, err := faultproxy.New("")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		peers = append(peers, p)
	}
	return etcdCluster(t, n, 50, 500, peers), peers
}

// Isolate cuts member i of an EtcdClusterProxied cluster off from the
// others both ways, as a partition would, while its clients still reach
// it; heal undoes it. The others' connections to it are refused at its
// proxy; its own, to their proxies, are barred by the sender id rafthttp
// puts in every request's header. Not barred: the member's forwards of
// lease requests to the leader (a keep-alive, a TimeToLive), whose HTTP
// requests do not name their sender; a partition would hold those too
// (tests of that wrap the client's Lease, as
// lock.TestEtcdInspectWhenALeaseReadIsHeld does).
func Isolate(members []*sequencer.Embedded, peers []*faultproxy.Proxy, i int) (heal func()) {
	peers[i].Refuse(true)
	peers[i].CutAll()
	from := []byte("X-Server-From: " + members[i].ID())
	for j, p := range peers {
		if j != i {
			p.Bar(from)
		}
	}
	return func() {
		peers[i].Refuse(false)
		for j, p := range peers {
			if j != i {
				p.Bar()
			}
		}
	}
}

// CutOffAFollower isolates a member that does not lead (Isolate) until
// the test ends, and returns it once it knows it has no leader, and when
// that was seen: from then on it refuses what it is sent.
func CutOffAFollower(t testing.TB, members []*sequencer.Embedded, peers []*faultproxy.Proxy) (k int, noLeader time.Time) {
	t.Helper()
	k = slices.IndexFunc(members, func(m *sequencer.Embedded) bool { return !m.IsLeader() })
	t.Cleanup(Isolate(members, peers, k))
	alone := EtcdClient(t, members[k].ClientURL())
	WaitUntil(t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		st, err := alone.Status(ctx, members[k].ClientURL())
		return err == nil && st.Leader == 0
	})
	return k, time.Now()
}

func etcdCluster(t testing.TB, n int, tickMs, electionMs uint, proxies []*faultproxy.Proxy) []*sequencer.Embedded {
	t.Helper()
	// Ports are picked free, then bound by etcd: another process may take
	// one in between. A bind failure writes nothing, so start again on
	// other ports.
	for attempt := 1; ; attempt++ {
		members, err := startCluster(t, n, tickMs, electionMs, proxies)
		if err == nil {
			for _, m := range members {
				t.Cleanup(func() { m.Close() })
			}
			return members
		}
		if attempt == 3 || !portTaken(err) {
			t.Fatal(err)
		}
	}
}

func startCluster(t testing.TB, n int, tickMs, electionMs uint, proxies []*faultproxy.Proxy) ([]*sequencer.Embedded, error) {
	cfgs := make([]sequencer.EmbedConfig, n)
	var initial []string
	urls := distinctURLs(t, 2*n)
	for i := range cfgs {
		cfgs[i] = sequencer.EmbedConfig{
			Dir: t.TempDir(), Name: fmt.Sprint("m", i),
			ClientURL: urls[2*i], PeerURL: urls[2*i+1],
			TickMs: tickMs, ElectionMs: electionMs, UnsafeNoFsync: true,
		}
		if proxies != nil {
			proxies[i].SetTarget(strings.TrimPrefix(urls[2*i+1], "http://"))
			cfgs[i].ListenPeerURL, cfgs[i].PeerURL = urls[2*i+1], "http://"+proxies[i].Addr()
		}
		initial = append(initial, cfgs[i].Name+"="+cfgs[i].PeerURL)
	}
	members := make([]*sequencer.Embedded, n)
	errs := make([]error, n)
	// A member that fails stops the others waiting for a quorum.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(initial, ",")
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if members[i], errs[i] = sequencer.StartEmbedded(ctx, cfgs[i]); errs[i] != nil {
				cancel()
			}
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			for _, m := range members {
				if m != nil {
					m.Close()
				}
			}
			return nil, fmt.Errorf("etcd member %d: %w", i, err)
		}
	}
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("etcd member %d: %w", i, err)
		}
	}
	return members, nil
}

// ClusterClient is a client of every member, closed by t.Cleanup.
func ClusterClient(t testing.TB, members []*sequencer.Embedded) *clientv3.Client {
	t.Helper()
	var eps []string
	for _, m := range members {
		eps = append(eps, m.ClientURL())
	}
	return EtcdClient(t, eps...)
}

// EtcdClient is a client of the endpoints, closed by t.Cleanup.
func EtcdClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// ClusterClientProxied is a client of every member, each reached through
// a loopback proxy the test controls (proxies[i] is member i's client
// port: hold, cut or slow one link); t.Cleanup closes them all.
func ClusterClientProxied(t testing.TB, members []*sequencer.Embedded) (*clientv3.Client, []*faultproxy.Proxy) {
	t.Helper()
	var proxies []*faultproxy.Proxy
	var eps []string
	for _, m := range members {
		p, err := faultproxy.New(strings.TrimPrefix(m.ClientURL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies = append(proxies, p)
		eps = append(eps, p.Addr())
	}
	return EtcdClient(t, eps...), proxies
}

// NextWithin receives from ch until it gives a value match accepts, and
// returns it; false, with the last value received, if ch closes or none
// came within d.
func NextWithin[T any](ch <-chan T, d time.Duration, match func(T) bool) (last T, ok bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		select {
		case v, open := <-ch:
			if !open {
				return last, false
			}
			if last = v; match(v) {
				return v, true
			}
		case <-deadline.C:
			return last, false
		}
	}
}

// EtcdThroughProxy is a client of e through a loopback proxy the test
// controls (internal/faultproxy: hold, cut or slow its traffic); t.Cleanup
// closes both.
func EtcdThroughProxy(t testing.TB, e *sequencer.Embedded) (*faultproxy.Proxy, *clientv3.Client) {
	t.Helper()
	p, err := faultproxy.New(strings.TrimPrefix(e.ClientURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, EtcdClient(t, p.Addr())
}

// StopEtcdBehind stops e, which clients reach through p
// (EtcdThroughProxy), as a cluster lost or wiped, and closes direct, a
// client of e's own: p refuses meanwhile and cuts what it carries, so that
// no stream holds e's graceful close, then accepts again, for the caller
// to point at another etcd (PointAt).
func StopEtcdBehind(p *faultproxy.Proxy, e *sequencer.Embedded, direct *clientv3.Client) {
	direct.Close()
	p.Refuse(true)
	p.CutAll()
	e.Close()
	p.Refuse(false)
}

// PointAt sends p's new connections to e, and cuts those it carries: its
// clients reach e from their next call.
func PointAt(p *faultproxy.Proxy, e *sequencer.Embedded) {
	p.SetTarget(strings.TrimPrefix(e.ClientURL(), "http://"))
	p.CutAll()
}

// ProxiedURL is a free loopback URL (http://127.0.0.1:port) for a server
// to listen on, and a proxy the test controls in front of it, for the
// server to be reached at; t.Cleanup closes the proxy. The proxy's port
// is taken before the free one is picked, so that the two differ.
func ProxiedURL(t testing.TB) (listen string, p *faultproxy.Proxy) {
	t.Helper()
	p, err := faultproxy.New("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	listen = FreeURL(t)
	p.SetTarget(strings.TrimPrefix(listen, "http://"))
	return listen, p
}

// Leader is the member that leads now, or nil.
func Leader(members []*sequencer.Embedded) *sequencer.Embedded {
	for _, m := range members {
		if m.IsLeader() {
			return m
		}
	}
	return nil
}

// distinctURLs returns n loopback URLs on ports free a moment ago, no two
// alike: the system may hand the same free port to calls in a row.
func distinctURLs(t testing.TB, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	var urls []string
	for len(urls) < n {
		if u := FreeURL(t); !seen[u] {
			seen[u] = true
			urls = append(urls, u)
		}
	}
	return urls
}

// Restart starts member i of members again, closed before, on its data dir
// and URLs, with EtcdCluster's timing; it replaces members[i] and is
// closed by t.Cleanup. It returns once the member has joined a quorum, so
// with the others of a majority down it must run concurrently with their
// restarts. Its ports were its own a moment ago; another process may take
// one meanwhile, which fails the test (the peers know these URLs only).
func Restart(t testing.TB, members []*sequencer.Embedded, i int) *sequencer.Embedded {
	t.Helper()
	again, err := RestartMember(t, members, i)
	if err != nil {
		t.Fatal(err)
	}
	return again
}

// RestartMember is Restart returning its error, for a goroutine other than
// the test's.
func RestartMember(t testing.TB, members []*sequencer.Embedded, i int) (*sequencer.Embedded, error) {
	var initial []string
	for _, m := range members {
		initial = append(initial, m.Name()+"="+m.PeerURL())
	}
	m := members[i]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	again, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{
		Dir: m.Dir(), Name: m.Name(), ClientURL: m.ClientURL(), PeerURL: m.PeerURL(), ListenPeerURL: m.ListenPeerURL(),
		InitialCluster: strings.Join(initial, ","), TickMs: 50, ElectionMs: 500, UnsafeNoFsync: true,
	})
	if err != nil {
		return nil, fmt.Errorf("restart etcd member %s: %w", m.Name(), err)
	}
	t.Cleanup(func() { again.Close() })
	members[i] = again
	return again, nil
}
