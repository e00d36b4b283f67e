package client_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/server"
)

// testCA is a CA made for one test, and a certificate it signed for
// 127.0.0.1 (not localhost).
type testCA struct {
	pool *x509.CertPool // trusts the CA
	cert tls.Certificate
}

// unpooled is a client option for a transport with tc that makes a new
// connection, a handshake, for every request. A request on a pooled
// connection the server had just closed may be written before the client
// sees the close: an answer lost, after which the next request's
// certificate failure is no longer "nothing was sent" (defect 258).
func unpooled(tc *tls.Config) client.Option {
	return client.WithHTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}})
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	ca := testenv.NewCA(t, "fenced client test CA")
	_, _, cert := ca.Issue(t, 2, "fenced", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	return testCA{pool: ca.Pool, cert: cert}
}

// tlsServer is an HTTPS fenced API server over f's locks.
type tlsServer struct {
	url   string
	hs    *httptest.Server
	conns atomic.Int64                    // connections accepted: a handshake each
	cert  atomic.Pointer[tls.Certificate] // the certificate it presents now
	// Mutual TLS, when set: the CAs a client's certificate must be
	// signed by. maxVersion, when set, caps the TLS version.
	clientCAs  atomic.Pointer[x509.CertPool]
	maxVersion atomic.Uint32
}

// serveTLS starts it, presenting cert. wrap, if given, wraps the API's
// handler (a test that acts between a request and its answer).
func serveTLS(t *testing.T, f *fixture, cert tls.Certificate, wrap ...func(*tlsServer, http.Handler) http.Handler) *tlsServer {
	t.Helper()
	srv, err := server.New(server.Config{Locks: f.locks, MaxTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsServer{}
	var h http.Handler = srv
	for _, w := range wrap {
		h = w(s, h)
	}
	s.hs = httptest.NewUnstartedServer(h)
	s.cert.Store(&cert)
	// Not GetCertificate: a client that dials an IP address sends no
	// server name, and then the first of Certificates, which StartTLS
	// fills with its own, is presented instead.
	s.hs.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		tc := &tls.Config{Certificates: []tls.Certificate{*s.cert.Load()}, MaxVersion: uint16(s.maxVersion.Load())}
		if pool := s.clientCAs.Load(); pool != nil {
			tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
		return tc, nil
	}}
	s.hs.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.hs.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshakes
	s.hs.StartTLS()
	t.Cleanup(s.hs.Close)
	s.url = s.hs.URL
	return s
}

// untrusted checks that err is the failure of a certificate the client
// does not trust, said so, with what to do (do, in its words): and that
// it was not sent again, to this server or another (handshakes: the
// connections the servers accepted for it).
func untrusted(t *testing.T, what string, err error, do string, handshakes int64) {
	t.Helper()
	var cve *tls.CertificateVerificationError
	switch {
	case !errors.Is(err, client.ErrCertificate):
		t.Fatalf("%s: %v; want an error matching client.ErrCertificate", what, err)
	case !errors.As(err, &cve):
		t.Fatalf("%s: %v; want the *tls.CertificateVerificationError inside", what, err)
	case !errors.Is(err, lock.ErrCannotSend):
		t.Fatalf("%s: %v; want an error matching lock.ErrCannotSend: a lease's keep-alive gives up on it", what, err)
	case !strings.Contains(err.Error(), "certificate is not trusted") || !strings.Contains(err.Error(), do):
		t.Fatalf("%s: %q; want it to say the certificate is not trusted and what to do", what, err)
	case handshakes != 1:
		t.Fatalf("%s: %d handshakes, want 1: a certificate not trusted was tried again (%v)", what, handshakes, err)
	}
	nothingReachedAServer(t, what, err)
}

// giveTheCA is what an error says to do about a certificate signed by a CA
// the client was not given.
const giveTheCA = "give the client the CA that signed it (WithTLSConfig"

// TestUntrustedCertificateFailsAtOnce: a server certificate the client
// does not trust (signed by a CA it does not know, or not for the host
// name of its URL) fails every handshake alike until the client is given
// the CA: it is no transient failure. Before, the client took it for one
// (unanswered): a waiting Acquire (WithWait 20s) rode it out with a
// handshake every back-off until its wait ended, and short requests were
// sent WithRetries times more, all with a message that said nothing of
// what to do.
func TestUntrustedCertificateFailsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca := newTestCA(t)
	srv := serveTLS(t, f, ca.cert)
	port := srv.url[strings.LastIndex(srv.url, ":")+1:]

	for _, c := range []struct {
		name string
		url  string
		tc   *tls.Config
		do   string
	}{
		{"UnknownCA", srv.url, nil, giveTheCA},
		// The certificate holds 127.0.0.1 only.
		{"NotItsHostName", "https://localhost:" + port, &tls.Config{RootCAs: ca.pool}, "not issued for the host of https://localhost:" + port},
	} {
		t.Run(c.name, func(t *testing.T) {
			var opts []client.Option
			if c.tc != nil {
				opts = append(opts, client.WithTLSConfig(c.tc))
			}
			cl := newClient(t, c.url, opts...)
			everyCall(t, cl, srv, "a certificate not trusted", func(what string, err error, handshakes int64) {
				untrusted(t, what, err, c.do, handshakes)
			})
		})
	}
	// Given the CA, the same client settings work: acquire, refresh, release.
	cl := newClient(t, srv.url, client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}))
	works(t, cl)
}

// TestUntrustedCertificateAfterTheGrant: a server whose certificate
// changes to one the client does not trust (a rotation to another CA)
// while a lease is held. The refresh and the release fail at once, once,
// and say why; the release does not say it may have released the lease:
// nothing reached the server, and says that the lock stays held until its
// TTL. Nor does the release count as one that may have been applied: when
// the certificate is trusted again, a release answered "lost, maybe
// released" (the lock force-released meanwhile, and the store's memory of
// released lease ids full) is a loss, not the answer to its own release
// (before, Release returned nil for it).
func TestUntrustedCertificateAfterTheGrant(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca, other := newTestCA(t), newTestCA(t)
	srv := serveTLS(t, f, ca.cert)
	cl := newClient(t, srv.url, unpooled(&tls.Config{RootCAs: ca.pool}))
	ctx := t.Context()
	name := testenv.Name(t)
	l, err := cl.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv.cert.Store(&other.cert)
	before := srv.conns.Load()
	untrusted(t, "Refresh", l.Refresh(ctx, 0), giveTheCA, srv.conns.Load()-before)
	before = srv.conns.Load()
	err = l.Release(ctx)
	untrusted(t, "Release", err, giveTheCA, srv.conns.Load()-before)
	if !strings.Contains(err.Error(), "stays held in the store until its TTL runs out") {
		t.Errorf("Release: %q; want it to say that the lock stays held until its TTL", err) // and go on
	}

	srv.cert.Store(&ca.cert)
	if _, err := f.locks.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	forgetReleases(t, f, name)
	if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Release after a force-release: %v; want ErrLost: the release before reached no server", err)
	}
}

// TestUntrustedCertificateOfOneServer: with several servers, one whose
// certificate the client does not trust is passed over, as one that cannot
// be reached is (nothing reached it), and the client stays with the next;
// when every server's is not trusted, the call fails at once, once each.
func TestUntrustedCertificateOfOneServer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca, other := newTestCA(t), newTestCA(t)
	bad, good := serveTLS(t, f, other.cert), serveTLS(t, f, ca.cert)
	ctx := t.Context()

	cl := newClient(t, bad.url+","+good.url, client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}))
	l, err := cl.Acquire(ctx, testenv.Name(t), 5*time.Second, lock.WithWait(20*time.Second))
	if err != nil {
		t.Fatalf("Acquire with the first server's certificate not trusted: %v; want the lock from the next", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := bad.conns.Load(); n != 1 {
		t.Fatalf("the server not trusted had %d handshakes, want 1: the client stays with the next", n)
	}

	bad2 := serveTLS(t, f, other.cert)
	all := newClient(t, bad.url+","+bad2.url, client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}))
	before := bad.conns.Load()
	began := time.Now()
	_, err = all.Acquire(ctx, testenv.Name(t), 5*time.Second, lock.WithWait(20*time.Second))
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("Acquire took %s: the client rode out certificates not trusted (%v)", took.Round(time.Millisecond), err)
	}
	untrusted(t, "Acquire of two servers not trusted", err, giveTheCA, bad.conns.Load()-before)
	if n := bad2.conns.Load(); n != 1 {
		t.Fatalf("the second server had %d handshakes, want 1", n)
	}
	var se *client.ServerError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), bad2.url) {
		t.Fatalf("%v; want a ServerError per server", err)
	}

	// A server not trusted and one that cannot be reached (a restart): the
	// second may be back when asked again, so the wait rides it out.
	mixed := newClient(t, bad.url+","+deadURL(t), client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}))
	before = bad.conns.Load()
	_, err = mixed.Acquire(ctx, testenv.Name(t), 5*time.Second, lock.WithWait(time.Second))
	var cve *tls.CertificateVerificationError
	if errors.Is(err, client.ErrCertificate) || !errors.As(err, &cve) || !strings.Contains(err.Error(), giveTheCA) {
		t.Fatalf("%v; want the last round's error, which says why the first server failed, and no ErrCertificate: another server may answer", err)
	}
	if n := bad.conns.Load() - before; n < 2 {
		t.Fatalf("%d handshakes with the server not trusted: the wait did not ride out the one that could not be reached", n)
	}
}

// TestObserveEndsOnAnUntrustedCertificate: an Observe whose server's
// certificate changes to one the client does not trust closes its channel
// (ctx alive), as after a final refusal, rather than sending its long poll
// again every second for ever; Observe called again says why.
func TestObserveEndsOnAnUntrustedCertificate(t *testing.T) {
	t.Parallel()
	f := etcdFixture(t)
	ca, other := newTestCA(t), newTestCA(t)
	srv := serveTLS(t, f, ca.cert)
	cl := newClient(t, srv.url, client.WithTLSConfig(&tls.Config{RootCAs: ca.pool}), client.WithMaxRequestWait(200*time.Millisecond))
	ctx := t.Context()
	name := testenv.Name(t)
	obs, err := cl.Observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l := testenv.Next(t, obs); l.Leading {
		t.Fatalf("before any campaign: %+v", l)
	}
	srv.cert.Store(&other.cert)
	srv.hs.CloseClientConnections()
	select {
	case l, ok := <-obs:
		if ok {
			t.Fatalf("observed %+v after the certificate changed; want the channel closed", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the channel is still open 10s after the server's certificate stopped being trusted (%d handshakes)", srv.conns.Load())
	}
	before := srv.conns.Load()
	_, err = cl.Observe(ctx, name)
	untrusted(t, "Observe again", err, giveTheCA, srv.conns.Load()-before)
}

// everyCall makes each kind of call of cl once, alone, and hands check its
// error and the handshakes it made; one that took over 10 s rode out the
// failure (what).
func everyCall(t *testing.T, cl *client.Client, srv *tlsServer, what string, check func(call string, err error, handshakes int64)) {
	t.Helper()
	ctx, name := t.Context(), testenv.Name(t)
	measure := func(call string, do func() error) {
		t.Helper()
		before := srv.conns.Load()
		began := time.Now()
		err := do()
		if took := time.Since(began); took > 10*time.Second {
			t.Fatalf("%s took %s: the client rode out %s (%v)", call, took.Round(time.Millisecond), what, err)
		}
		check(call, err, srv.conns.Load()-before)
	}
	measure("Acquire WithWait(20s)", func() error {
		_, err := cl.Acquire(ctx, name, 5*time.Second, lock.WithWait(20*time.Second))
		return err
	})
	measure("TryAcquire", func() error { _, err := cl.TryAcquire(ctx, name, 5*time.Second); return err })
	measure("Inspect", func() error { _, err := cl.Inspect(ctx, name); return err })
	measure("List", func() error { _, err := cl.List(ctx, "", 10, ""); return err })
	measure("ForceRelease", func() error { _, err := cl.ForceRelease(ctx, name); return err })
	measure("ForceRelease IfToken", func() error { _, err := cl.ForceRelease(ctx, name, lock.IfToken(1)); return err })
	measure("Elect WithWait(20s)", func() error {
		_, err := cl.Elect(ctx, name, "v", 5*time.Second, lock.WithWait(20*time.Second))
		return err
	})
	measure("Observe", func() error { _, err := cl.Observe(ctx, name); return err })
}

// works fails t unless cl acquires, refreshes and releases a lock.
func works(t *testing.T, cl *client.Client) {
	t.Helper()
	ctx := t.Context()
	l, err := cl.Acquire(ctx, testenv.Name(t), 5*time.Second, lock.WithWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// nothingReachedAServer fails t if err bears a mark of a request that
// reached a server, or says it may have been applied.
func nothingReachedAServer(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case errors.Is(err, lock.ErrNotAcquired), errors.Is(err, lock.ErrLost), errors.Is(err, lock.ErrMaybeReleased),
		errors.Is(err, lock.ErrSentAgain), errors.Is(err, client.ErrNoAnswer):
		t.Fatalf("%s: %v; want no other mark: nothing reached a server", what, err)
	case strings.Contains(err.Error(), "may have"):
		t.Fatalf("%s: %q says the request may have been applied: nothing reached a server", what, err)
	}
}

// forgetReleases has other holders take and release name 16 times: the
// Redis store remembers the last 16 released lease ids, and then no
// longer knows an earlier release of name.
func forgetReleases(t *testing.T, f *fixture, name string) {
	t.Helper()
	for range 16 {
		o, err := f.locks.TryAcquire(t.Context(), name, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}
