package client_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/lock"
)

// refused checks that err is the server's refusal of the client's
// certificate, said so, with what to do (do, in its words), and that it
// was not sent again (handshakes: the connections the server accepted for
// it).
func refused(t *testing.T, what string, err error, do string, handshakes int64) {
	t.Helper()
	switch {
	case handshakes != 1:
		t.Fatalf("%s: %d handshakes, want 1: a certificate refused was tried again (%v)", what, handshakes, err)
	case !errors.Is(err, client.ErrClientCertificate) || errors.Is(err, client.ErrCertificate):
		t.Fatalf("%s: %v; want an error matching client.ErrClientCertificate, not ErrCertificate (the server's certificate is trusted)", what, err)
	case !errors.Is(err, lock.ErrCannotSend):
		t.Fatalf("%s: %v; want an error matching lock.ErrCannotSend", what, err)
	case !strings.Contains(err.Error(), "the server refused the client's TLS certificate") || !strings.Contains(err.Error(), do):
		t.Fatalf("%s: %q; want it to say the server refused the client's certificate, and %q", what, err, do)
	}
	nothingReachedAServer(t, what, err)
}

// TestRefusedClientCertificateFailsAtOnce: a server that requires a client
// certificate (mutual TLS) and refuses the client's, or its lack of one,
// refuses every handshake alike until the client is given one it accepts:
// no transient failure. Under TLS 1.3 its alert reaches the client after
// the client's side of the handshake is over, when the request was
// written, at the first read. Before, the client took it for a lost
// answer: a waiting Acquire (WithWait 20s) rode it out until its wait
// ended, and short requests were sent WithRetries times more, with
// crypto/tls's words alone ("remote error: tls: certificate required").
func TestRefusedClientCertificateFailsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca := testenv.NewCA(t, "fenced client test CA") // the server's, and its clients'
	_, _, serverCert := ca.Issue(t, 2, "fenced", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	_, _, good := ca.Issue(t, 3, "client", x509.ExtKeyUsageClientAuth)
	_, _, expired := ca.IssueValid(t, 4, "expired", x509.ExtKeyUsageClientAuth, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	_, _, notForClients := ca.Issue(t, 5, "server-usage", x509.ExtKeyUsageServerAuth)
	_, _, ofAnother := testenv.NewCA(t, "another CA").Issue(t, 3, "client", x509.ExtKeyUsageClientAuth)
	// A CA of the same name and another key: a Go client sends its
	// certificates (the server's request names the CA by name), and the
	// server does not trust them.
	_, _, ofATwin := testenv.NewCA(t, "fenced client test CA").Issue(t, 3, "client", x509.ExtKeyUsageClientAuth)
	srv := serveTLS(t, f, serverCert)
	srv.clientCAs.Store(ca.Pool)

	const none = "requires a client certificate (mutual TLS) and got none: give the client a certificate signed by a CA the server trusts, with its key (WithTLSConfig, a tls.Config whose Certificates holds it)"
	for _, c := range []struct {
		name string
		cert *tls.Certificate
		max  uint16 // the client's highest TLS version, or 0
		do   string
	}{
		{"None", nil, 0, none},
		{"OfAnotherCA", &ofAnother, 0, none}, // not sent: refused as none
		{"OfAnUnknownCA", &ofATwin, 0, "does not trust the CA that signed the client's certificate"},
		{"Expired", &expired, 0, "has expired or is not valid yet"},
		{"NotForClientAuth", &notForClients, 0, "issued for client authentication"},
		// A TLS 1.2 server that got no certificate says handshake failure,
		// during the handshake.
		{"NoneTLS12", nil, tls.VersionTLS12, "as a TLS 1.2 server says when it got none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := &tls.Config{RootCAs: ca.Pool, MaxVersion: c.max}
			if c.cert != nil {
				tc.Certificates = []tls.Certificate{*c.cert}
			}
			cl := newClient(t, srv.url, client.WithTLSConfig(tc))
			everyCall(t, cl, srv, "a certificate refused", func(what string, err error, handshakes int64) {
				refused(t, what, err, c.do, handshakes)
			})
		})
	}
	// Given a certificate the server accepts: acquire, refresh, release.
	cl := newClient(t, srv.url, client.WithTLSConfig(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{good}}))
	works(t, cl)
}

// TestKeepAliveEndsOnACertificateRefused: a lease kept alive through a
// server whose certificate the client stops trusting (rotated to another
// CA), or that starts to refuse the client's (mutual TLS turned on), is
// lost at the first refresh that fails so, and says why: no refresh will
// get through before its deadline. The lock stays held on the server
// until its TTL, and the lease's Err and Release say so. Before, the
// keep-alive tried again every ttl/10 until the deadline, and the holder
// learned only then, with ErrExpired alone.
func TestKeepAliveEndsOnACertificateRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		change func(srv *tlsServer, other testCA)
		want   error
	}{
		{"ServerCertificateRotated", func(srv *tlsServer, other testCA) { srv.cert.Store(&other.cert) }, client.ErrCertificate},
		{"ClientCertificateRequired", func(srv *tlsServer, other testCA) { srv.clientCAs.Store(other.pool) }, client.ErrClientCertificate},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			ca, other := newTestCA(t), newTestCA(t)
			srv := serveTLS(t, f, ca.cert)
			cl := newClient(t, srv.url, unpooled(&tls.Config{RootCAs: ca.pool}))
			ctx := t.Context()
			name := testenv.Name(t)
			l, err := cl.Acquire(ctx, name, 3*time.Second, lock.WithKeepAlive())
			if err != nil {
				t.Fatal(err)
			}
			c.change(srv, other)
			before := srv.conns.Load()
			select {
			case <-l.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the lease is not done 10s after the certificate was refused")
			}
			handshakes := srv.conns.Load() - before
			lost := l.Err()
			switch {
			case errors.Is(lost, lock.ErrExpired):
				t.Fatalf("Err: %v (%d handshakes); want the lease lost at the first refresh refused, before its deadline, not ErrExpired", lost, handshakes)
			case !errors.Is(lost, lock.ErrLost) || !errors.Is(lost, c.want):
				t.Fatalf("Err: %v; want ErrLost and %v", lost, c.want)
			case !strings.Contains(lost.Error(), "stays held in the store until its TTL runs out"):
				t.Fatalf("Err: %q; want it to say the lock stays held", lost)
			case handshakes != 1:
				t.Fatalf("%d handshakes after the change, want 1: the keep-alive tried again (%v)", handshakes, lost)
			}
			if st, err := f.locks.Inspect(ctx, name); err != nil || !st.Held {
				t.Fatalf("Inspect: %+v, %v; want the lock still held on the server, as said", st, err)
			}
			if err := l.Release(ctx); !errors.Is(err, lock.ErrLost) || !errors.Is(err, c.want) {
				t.Fatalf("Release: %v; want the loss, ErrLost and %v", err, c.want)
			}
		})
	}
}
