package main_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// pki is a test CA with a server certificate for 127.0.0.1 and a client
// certificate, all written as PEM files.
type pki struct {
	*testenv.CA                              // File, Pool
	certFile, keyFile, clientCert, clientKey string
	client                                   tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca := testenv.NewCA(t, "fenced test CA")
	p := &pki{CA: ca}
	p.certFile, p.keyFile, _ = ca.Issue(t, 2, "server", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	p.clientCert, p.clientKey, p.client = ca.Issue(t, 3, "client", x509.ExtKeyUsageClientAuth)
	return p
}

const testToken = "test-token-0123456789abcdef"

// TestTLSAndAuth serves HTTPS with bearer tokens, then mutual TLS, and
// checks who gets in.
func TestTLSAndAuth(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("# fenced tokens\n"+testToken+"\nother-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("TLSAndBearer", func(t *testing.T) {
		t.Parallel()
		// The token file comes from the environment.
		_, url := startDev(t, []string{"FENCED_AUTH_TOKEN_FILE=" + tokens}, "--tls-cert", p.certFile, "--tls-key", p.keyFile)
		if url[:8] != "https://" {
			t.Fatalf("URL %s, want https", url)
		}
		a := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.Pool})
		name := testenv.Name(t)
		for _, c := range []struct {
			tok  string
			want int
		}{{"", 401}, {"wrong-token-0123456789abcdef", 401}, {testToken, 200}} {
			m := a.withToken(c.tok).must(c.want, "POST", "/v1/locks/"+name+"/acquire", `{"ttl_ms":5000}`)
			if e, _ := m["error"].(map[string]any); c.want == 401 && e["code"] != "unauthenticated" {
				t.Fatalf("token %q: %v, want code unauthenticated", c.tok, m)
			}
		}
		a.must(200, "GET", "/healthz", "") // probes need no token
		a.must(401, "GET", "/metrics", "")
		// A client that does not trust the CA fails the handshake.
		if _, _, err := newAPI(t, url).do("GET", "/healthz", ""); err == nil {
			t.Fatal("a client without the CA was served")
		}
		// fenced exec with the CA and a token file.
		if code, _, stderr := run(t, nil, "exec", "--url", url, "--client-tls-ca", p.File, "--client-token-file", tokens, testenv.Name(t), "--", "true"); code != 0 {
			t.Fatalf("fenced exec over TLS: exit %d\n%s", code, stderr)
		}
		if code, _, _ := run(t, nil, "exec", "--url", url, "--client-tls-ca", p.File, testenv.Name(t), "--", "true"); code != 1 {
			t.Fatalf("fenced exec without a token: exit %d, want 1", code)
		}
	})

	t.Run("MutualTLS", func(t *testing.T) {
		t.Parallel()
		_, url := startDev(t, nil, "--tls-cert", p.certFile, "--tls-key", p.keyFile, "--tls-client-ca", p.File)
		if _, _, err := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.Pool}).do("GET", "/healthz", ""); err == nil {
			t.Fatal("a client without a certificate was served")
		}
		a := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.Pool, Certificates: []tls.Certificate{p.client}})
		a.must(200, "GET", "/healthz", "")
		a.acquire(testenv.Name(t), 5000)
		if code, _, stderr := run(t, []string{"FENCED_CLIENT_TLS_CERT=" + p.clientCert, "FENCED_CLIENT_TLS_KEY=" + p.clientKey},
			"exec", "--url", url, "--client-tls-ca", p.File, testenv.Name(t), "--", "true"); code != 0 {
			t.Fatalf("fenced exec with a client certificate: exit %d\n%s", code, stderr)
		}
	})
}

// TestTLSCertificateReloads: the served certificate is replaced without a
// restart, on SIGHUP and, within tlsLookEvery (10 s), when its files
// change; files that do not load leave the one in force; /metrics says
// when the one in force expires. Before, a rotated certificate (cert-manager,
// an ACME client) took a restart, which ended every waiting request.
func TestTLSCertificateReloads(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	certFile, keyFile := filepath.Join(t.TempDir(), "tls.pem"), filepath.Join(t.TempDir(), "tls-key.pem")
	install := func(serial int64) time.Time {
		t.Helper()
		cf, kf, pair := p.Issue(t, serial, fmt.Sprint("server-", serial), x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
		for _, c := range [][2]string{{cf, certFile}, {kf, keyFile}} {
			b, err := os.ReadFile(c[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(c[1], b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return pair.Leaf.NotAfter
	}
	install(10)
	proc, url := startDev(t, nil, "--tls-cert", certFile, "--tls-key", keyFile)
	served := func() int64 { // the serial a new connection is served
		t.Helper()
		conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "https://"), &tls.Config{RootCAs: p.Pool})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := served(); s != 10 {
		t.Fatalf("serial %d served, want 10", s)
	}
	a := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.Pool})

	// SIGHUP: at once.
	expires := install(11)
	proc.signal(syscall.SIGHUP)
	eventually(t, 20*time.Second, "the reload in the log", func() bool {
		return strings.Contains(proc.stderr.String(), "TLS certificate reloaded (SIGHUP)")
	})
	if s := served(); s != 11 {
		t.Fatalf("after SIGHUP, serial %d served, want 11", s)
	}
	a.acquire(testenv.Name(t), 1000)
	a.hc.CloseIdleConnections() // the metrics below on a new connection too
	_, body := a.text("/metrics")
	if want := fmt.Sprintf("fenced_tls_certificate_expiry_timestamp_seconds %g", float64(expires.Unix())); !strings.Contains(body, want) {
		t.Fatalf("/metrics lacks %q:\n%s", want, body)
	}

	// Files that do not load: the certificate in force stays, the log says why.
	if err := os.WriteFile(certFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proc.signal(syscall.SIGHUP)
	eventually(t, 20*time.Second, "the failed reload in the log", func() bool {
		return strings.Contains(proc.stderr.String(), "TLS certificate not reloaded (SIGHUP)")
	})
	if s := served(); s != 11 {
		t.Fatalf("after a reload that failed, serial %d served, want 11", s)
	}

	// No signal: a handshake finds the files changed.
	install(12)
	eventually(t, 60*time.Second, "the new certificate served without a signal", func() bool { return served() == 12 })
	// The log line is written after the swap and read through a pipe: it may
	// trail the handshake that was served the new certificate.
	eventually(t, 20*time.Second, "the reload in the log", func() bool {
		return strings.Contains(proc.stderr.String(), "TLS certificate reloaded (its files changed)")
	})
}
