package testenv

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
)

// CA is a certificate authority made for one test, valid for the hour
// around its making, its certificate written as PEM to File.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // trusts the CA alone
	File string

	key *ecdsa.PrivateKey
	dir string
}

// NewCA makes a CA named cn.
func NewCA(t testing.TB, cn string) *CA {
	t.Helper()
	ca := &CA{key: newKey(t), dir: t.TempDir(), Pool: x509.NewCertPool()}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	ca.Pool.AddCert(ca.Cert)
	ca.File = filepath.Join(ca.dir, "ca.pem")
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue signs a certificate for cn (and ips) with usage, valid for the
// hour around now, and writes it and its key as cn.pem and cn-key.pem in
// the CA's directory.
func (ca *CA) Issue(t testing.TB, serial int64, cn string, usage x509.ExtKeyUsage, ips ...net.IP) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	return ca.IssueValid(t, serial, cn, usage, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), ips...)
}

// IssueValid is Issue of a certificate valid from notBefore to notAfter
// (an expired one, say).
func (ca *CA) IssueValid(t testing.TB, serial int64, cn string, usage x509.ExtKeyUsage, notBefore, notAfter time.Time, ips ...net.IP) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, cn+".pem"), filepath.Join(ca.dir, cn+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	if pair, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
