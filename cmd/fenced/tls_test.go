package main_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// pki is a test CA with a server certificate for 127.0.0.1 and a client
// certificate, all written as PEM files.
type pki struct {
	caFile, certFile, keyFile, clientCert, clientKey string
	pool                                             *x509.CertPool
	client                                           tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fenced test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{caFile: filepath.Join(dir, "ca.pem"), pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) (string, string, tls.Certificate) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cf, kf := filepath.Join(dir, cn+".pem"), filepath.Join(dir, cn+"-key.pem")
		writePEM(t, cf, "CERTIFICATE", der)
		writePEM(t, kf, "EC PRIVATE KEY", kder)
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		return cf, kf, pair
	}
	p.certFile, p.keyFile, _ = issue(2, "server", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.clientCert, p.clientKey, p.client = issue(3, "client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
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
		a := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.pool})
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
		if code, _, stderr := run(t, nil, "exec", "--url", url, "--client-tls-ca", p.caFile, "--client-token-file", tokens, testenv.Name(t), "--", "true"); code != 0 {
			t.Fatalf("fenced exec over TLS: exit %d\n%s", code, stderr)
		}
		if code, _, _ := run(t, nil, "exec", "--url", url, "--client-tls-ca", p.caFile, testenv.Name(t), "--", "true"); code != 1 {
			t.Fatalf("fenced exec without a token: exit %d, want 1", code)
		}
	})

	t.Run("MutualTLS", func(t *testing.T) {
		t.Parallel()
		_, url := startDev(t, nil, "--tls-cert", p.certFile, "--tls-key", p.keyFile, "--tls-client-ca", p.caFile)
		if _, _, err := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.pool}).do("GET", "/healthz", ""); err == nil {
			t.Fatal("a client without a certificate was served")
		}
		a := newAPI(t, url).withTLS(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.client}})
		a.must(200, "GET", "/healthz", "")
		a.acquire(testenv.Name(t), 5000)
		if code, _, stderr := run(t, []string{"FENCED_CLIENT_TLS_CERT=" + p.clientCert, "FENCED_CLIENT_TLS_KEY=" + p.clientKey},
			"exec", "--url", url, "--client-tls-ca", p.caFile, testenv.Name(t), "--", "true"); code != 0 {
			t.Fatalf("fenced exec with a client certificate: exit %d\n%s", code, stderr)
		}
	})
}
