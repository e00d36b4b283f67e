package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/faultproxy"
	"github.com/fenced/fenced/internal/testenv"
)

// An embedded member reached at one address and listening on another (in a
// container: reached by name, listening on 0.0.0.0; here a proxy in front
// of each port) advertises the first and listens on the second.
func TestServeMemberListensApartFromItsURLs(t *testing.T) {
	t.Parallel()
	var reached, listen [2]string // client, peer
	var proxies [2]*faultproxy.Proxy
	for i := range proxies {
		listen[i], proxies[i] = testenv.ProxiedURL(t)
		reached[i] = "http://" + proxies[i].Addr()
	}
	p := start(t, nil, "serve", "--listen", "127.0.0.1:0", "--lease-store", "etcd", "--etcd-data-dir", t.TempDir(),
		"--etcd-client-url", reached[0], "--etcd-listen-client-url", listen[0],
		"--etcd-peer-url", reached[1], "--etcd-listen-peer-url", listen[1], "--etcd-unsafe-no-fsync")
	a := newAPI(t, p.listening())
	code, m, err := a.do("POST", "/v1/locks/"+testenv.Name(t)+"/acquire", `{"ttl_ms":1000}`)
	if err != nil || code != 200 {
		t.Fatalf("acquire: %d %v %v; stderr:\n%s", code, m, err, p.stderr.String())
	}
	toLease(t, m)

	cli := testenv.EtcdClient(t, reached[0])
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Members) != 1 {
		t.Fatalf("members %v, want this one", list.Members)
	}
	got := list.Members[0]
	if strings.Join(got.ClientURLs, ",") != reached[0] || strings.Join(got.PeerURLs, ",") != reached[1] {
		t.Errorf("the member is listed at clients %v and peers %v, want %s and %s", got.ClientURLs, got.PeerURLs, reached[0], reached[1])
	}
	for _, want := range []string{"listen_client_url=" + listen[0], "listen_peer_url=" + listen[1]} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("the log does not say %s: %s", want, p.stderr.String())
		}
	}

	// fenced's own client dials where the member listens, not where it
	// is reached from elsewhere (a name or a NAT that may not lead back to
	// this host from this host): with that address held, tokens come.
	proxies[0].Hold(true)
	defer proxies[0].Hold(false)
	for range 3 {
		code, m, err := a.do("POST", "/v1/locks/"+testenv.Name(t)+"/acquire", `{"ttl_ms":1000}`)
		if err != nil || code != 200 {
			t.Fatalf("acquire with the member's advertised client URL held: %d %v %v", code, m, err)
		}
	}
}
