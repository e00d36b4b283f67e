package sequencer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/freeport"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Members that listen on one address and are reached at another (a
// container's 0.0.0.0 and its name; here a proxy in front of each port)
// advertise the address they are reached at, and talk to each other
// through it: with the peers' proxies held, the cluster has no quorum.
func TestMembersListenApartFromWhereTheyAreReached(t *testing.T) {
	t.Parallel()
	const n = 3
	type member struct {
		cfg           sequencer.EmbedConfig
		client, peers *faultproxy.Proxy
	}
	ms := make([]member, n)
	var initial []string
	for i := range ms {
		m := &ms[i]
		m.cfg = sequencer.EmbedConfig{Dir: t.TempDir(), Name: fmt.Sprint("m", i), TickMs: 50, ElectionMs: 500, UnsafeNoFsync: true}
		m.cfg.ListenClientURL, m.client = testenv.ProxiedURL(t)
		m.cfg.ListenPeerURL, m.peers = testenv.ProxiedURL(t)
		m.cfg.ClientURL, m.cfg.PeerURL = "http://"+m.client.Addr(), "http://"+m.peers.Addr()
		initial = append(initial, m.cfg.Name+"="+m.cfg.PeerURL)
	}
	members := make([]*sequencer.Embedded, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range ms {
		ms[i].cfg.InitialCluster = strings.Join(initial, ",")
		wg.Go(func() { members[i], errs[i] = sequencer.StartEmbedded(t.Context(), ms[i].cfg) })
	}
	wg.Wait()
	for i, m := range members {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(func() { m.Close() })
		if m.PeerURL() != ms[i].cfg.PeerURL || m.ClientURL() != ms[i].cfg.ClientURL {
			t.Fatalf("member %d says it is reached at %s and %s, want the proxies' %s and %s", i, m.PeerURL(), m.ClientURL(), ms[i].cfg.PeerURL, ms[i].cfg.ClientURL)
		}
	}

	// Clients reach the members through the advertised URLs, and the
	// cluster lists those.
	cli := testenv.ClusterClient(t, members)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, m := range ms {
		want[m.cfg.Name] = m.cfg.PeerURL + " " + m.cfg.ClientURL
	}
	for _, m := range list.Members {
		if got := strings.Join(m.PeerURLs, ",") + " " + strings.Join(m.ClientURLs, ","); got != want[m.Name] {
			t.Errorf("member %s is listed at %s, want %s", m.Name, got, want[m.Name])
		}
	}
	if _, err := cli.Put(ctx, testenv.Name(t), "x"); err != nil {
		t.Fatal(err)
	}

	// The members' traffic to each other goes through the advertised URLs:
	// held there, no write commits; let go, writes commit again.
	for _, m := range ms {
		m.peers.Hold(true)
	}
	held, stop := context.WithTimeout(t.Context(), 2*time.Second)
	_, err = cli.Put(held, testenv.Name(t), "x")
	stop()
	// Either deadline may come first: the caller's, or etcd's own request
	// timeout, which a leader that lost its quorum (CheckQuorum, an
	// election timeout of 500 ms) can answer sooner. Both say the write
	// did not commit.
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(rpctypes.Error(err), rpctypes.ErrTimeout) {
		t.Fatalf("a write with every member's peer traffic held: %v, want no commit before its deadline", err)
	}
	for _, m := range ms {
		m.peers.Hold(false)
	}
	testenv.WaitUntil(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := cli.Put(ctx, testenv.Name(t), "x")
		return err == nil
	})
}

// A member listening on every interface is reached by its own process on
// loopback, whatever the URL the others reach it at.
func TestLocalClientURLOfEveryInterface(t *testing.T) {
	t.Parallel()
	reached, err := freeport.URL()
	if err != nil {
		t.Fatal(err)
	}
	on, err := freeport.URL()
	if err != nil {
		t.Fatal(err)
	}
	port := on[strings.LastIndex(on, ":")+1:]
	e, err := sequencer.StartEmbedded(t.Context(), sequencer.EmbedConfig{
		Dir: t.TempDir(), UnsafeNoFsync: true, ClientURL: reached, ListenClientURL: "http://0.0.0.0:" + port,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got, want := e.LocalClientURL(), "http://127.0.0.1:"+port; got != want || e.ClientURL() != reached {
		t.Fatalf("LocalClientURL %s and ClientURL %s, want %s and %s", got, e.ClientURL(), want, reached)
	}
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, testenv.Name(t), "x"); err != nil {
		t.Fatalf("a write through the member's own client: %v", err)
	}
}
