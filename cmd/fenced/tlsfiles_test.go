package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTLSCertOutsideValidityRefused: a certificate that has expired, or is
// not valid yet, is refused when the flags are loaded, with the file, the
// date and what to do, on the server side and on every client side (one
// loader). fenced used to start with it, log ready, and fail every
// handshake.
func TestTLSCertOutsideValidityRefused(t *testing.T) {
	now := time.Now()
	expired := selfSigned(t, "expired", now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	future := selfSigned(t, "future", now.Add(24*time.Hour), now.Add(48*time.Hour))
	valid := selfSigned(t, "valid", now.Add(-time.Hour), now.Add(time.Hour))
	for _, c := range []struct {
		name      string
		cert, key string
		want      []string
	}{
		{"expired", expired[0], expired[1], []string{"--tls-cert " + expired[0], "expired at " + now.Add(-24*time.Hour).UTC().Format("2006-01-02T15"), "renew it"}},
		{"not yet valid", future[0], future[1], []string{"--tls-cert " + future[0], "not valid before " + now.Add(24*time.Hour).UTC().Format("2006-01-02T15"), "check this machine's clock"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := tlsFiles{cert: c.cert, key: c.key, certFlag: "--tls-cert", keyFlag: "--tls-key"}
			if _, err := f.server(); err == nil {
				t.Fatal("server side: accepted")
			} else {
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("server side: %v; want it to say %q", err, w)
					}
				}
			}
			f.certFlag = "--redis-tls-cert"
			if _, err := f.client(); err == nil || !strings.Contains(err.Error(), "--redis-tls-cert "+c.cert) {
				t.Errorf("client side: %v; want the certificate refused", err)
			}
		})
	}
	f := tlsFiles{cert: valid[0], key: valid[1], certFlag: "--tls-cert", keyFlag: "--tls-key"}
	if _, err := f.server(); err != nil {
		t.Fatalf("a valid certificate: %v", err)
	}
}

// selfSigned writes a self-signed certificate valid from notBefore to
// notAfter and its key; it returns their files.
func selfSigned(t *testing.T, name string, notBefore, notAfter time.Time) [2]string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := [2]string{filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")}
	for i, b := range []*pem.Block{{Type: "CERTIFICATE", Bytes: der}, {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(files[i], pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return files
}
